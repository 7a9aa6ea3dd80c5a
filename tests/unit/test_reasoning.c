/* test_reasoning.c — a thinking model's output split into reasoning and content (server/reasoning.h):
 * for each case the text is fed whole, byte by byte and cut at every position into two feeds,
 * and the concatenated pieces must be the same: tags never leak, a tag split across feeds is
 * recognised, nothing is lost. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "server/reasoning.h"

struct both {
    char reason[512], content[512];
};

static void run(bool on, const char *text, const size_t *cuts, int n_cuts, struct both *out)
{
    struct reasoning r;
    reasoning_init(&r, on);
    out->reason[0] = out->content[0] = 0;
    size_t at = 0, n = strlen(text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : n;
        assert_int_equal(reasoning_feed(&r, text + at, end - at, i == n_cuts, NULL), STATUS_OK);
        strncat(out->reason, r.reason, r.n_reason);
        strncat(out->content, r.content, r.n_content);
        at = end;
    }
    reasoning_free(&r);
}

static void check(bool on, const char *text, const char *want_reason, const char *want_content)
{
    struct both b;
    run(on, text, NULL, 0, &b);
    assert_string_equal(b.reason, want_reason);
    assert_string_equal(b.content, want_content);
    const size_t n = strlen(text);
    size_t *every = malloc((n + 1) * sizeof *every);
    for (size_t i = 0; i < n; i++)
        every[i] = i + 1;
    run(on, text, every, n > 0 ? (int)n - 1 : 0, &b); /* byte by byte */
    assert_string_equal(b.reason, want_reason);
    assert_string_equal(b.content, want_content);
    for (size_t k = 0; k <= n; k++) { /* two feeds, cut at k */
        run(on, text, &k, 1, &b);
        assert_string_equal(b.reason, want_reason);
        assert_string_equal(b.content, want_content);
    }
    free(every);
}

static void test_split(void **state)
{
    (void)state;
    check(true, "<think>\nLet me see: 2 + 2.\n</think>\n\nIt is 4.", "\nLet me see: 2 + 2.\n", "It is 4.");
    check(true, "  \n<think>a < b, </thin is not the end</think>ok", "a < b, </thin is not the end", "ok");
    check(true, "<think></think>\n\nJust the answer.", "", "Just the answer.");
    check(true, "No thinking here <think>x</think>", "", "No thinking here <think>x</think>");
    check(true, "<thin", "", "<thin");                           /* ended inside a possible tag: text */
    check(true, "<think>unfinished reasoning <", "unfinished reasoning <", "");
    check(true, "<<think>x", "", "<<think>x");
    check(true, "<think>a<</think>b", "a<", "b");
    check(false, "<think>kept</think>as is", "", "<think>kept</think>as is");
    check(true, "", "", "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_split)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
