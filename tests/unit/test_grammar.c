/* test_grammar.c — the grammar matcher (engine/grammar.h) and the JSON Schema compiler
 * (engine/grammar_json.h): strings each grammar must accept whole, reject, or accept only as a
 * prefix; every supported keyword; every refusal names the keyword and where it is.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "engine/grammar.h"
#include "engine/grammar_json.h"

/* 1: s is a whole sentence; 0: a live prefix only; -1: rejected. */
static int match(struct grammar *g, const char *s)
{
    struct grammar_matcher m;
    assert_int_equal(grammar_matcher_init(&m, g, NULL), STATUS_OK);
    int r = -1;
    if (grammar_matcher_accept_bytes(&m, (const uint8_t *)s, strlen(s)))
        r = grammar_matcher_can_end(&m) ? 1 : 0;
    grammar_matcher_free(&m);
    return r;
}

#define YES(g, s) assert_int_equal(match(g, s), 1)
#define PREFIX(g, s) assert_int_equal(match(g, s), 0)
#define NO(g, s) assert_int_equal(match(g, s), -1)

static struct grammar *schema(const char *text)
{
    struct grammar *g = NULL;
    struct err err = {0};
    enum status st = grammar_json_compile_text(text, strlen(text), NULL, &g, &err);
    if (st)
        print_message("compile failed: %s\n", err.msg);
    assert_int_equal(st, STATUS_OK);
    return g;
}

/* The compiler refuses text with st, and its message holds want. */
static void refused(const char *text, enum status st, const char *want)
{
    struct grammar *g = NULL;
    struct err err = {0};
    assert_int_equal(grammar_json_compile_text(text, strlen(text), NULL, &g, &err), st);
    assert_null(g);
    if (!strstr(err.msg, want))
        print_message("message \"%s\" lacks \"%s\"\n", err.msg, want);
    assert_non_null(strstr(err.msg, want));
}

static void test_builder_basics(void **state)
{
    (void)state;
    /* S ::= "ab" X ; X ::= [0-9]{1,3} ; also "c" */
    struct gram_builder b;
    gram_builder_init(&b);
    int s = gram_rule(&b);
    struct gram_class d = {{0}};
    gram_class_range(&d, '0', '9');
    int digit = gram_rule(&b);
    gram_push_class(&b, gram_alt(&b, digit), &d);
    int x = gram_repeat(&b, digit, -1, 1, 3);
    int a = gram_alt(&b, s);
    gram_push_bytes(&b, a, "ab", 2);
    gram_push_ref(&b, a, x);
    gram_push_bytes(&b, gram_alt(&b, s), "c", 1);
    struct grammar *g = NULL;
    assert_int_equal(gram_builder_finish(&b, s, &g, NULL), STATUS_OK);
    YES(g, "ab1");
    YES(g, "ab123");
    YES(g, "c");
    PREFIX(g, "ab");
    PREFIX(g, "a");
    PREFIX(g, "");
    NO(g, "ab1234");
    NO(g, "abx");
    NO(g, "cc");
    /* done: nothing can follow "c" nor "ab123"; "ab1" may go on */
    struct grammar_matcher m;
    assert_int_equal(grammar_matcher_init(&m, g, NULL), STATUS_OK);
    assert_true(grammar_matcher_accept_bytes(&m, (const uint8_t *)"ab1", 3));
    assert_true(grammar_matcher_can_end(&m));
    assert_false(grammar_matcher_done(&m));
    assert_false(grammar_matcher_accept_bytes(&m, (const uint8_t *)"2x", 2)); /* refused whole: state kept */
    assert_true(grammar_matcher_accept_bytes(&m, (const uint8_t *)"23", 2));
    assert_true(grammar_matcher_done(&m));
    grammar_matcher_free(&m);
    grammar_put(g);
}

static void test_builder_repeat_sep(void **state)
{
    (void)state;
    /* L ::= "x" ("," "x"){1,2} : 2 to 3 items */
    struct gram_builder b;
    gram_builder_init(&b);
    int x = gram_rule_bytes(&b, "x", 1), c = gram_rule_bytes(&b, ",", 1);
    int l = gram_repeat(&b, x, c, 2, 3);
    struct grammar *g = NULL;
    assert_int_equal(gram_builder_finish(&b, l, &g, NULL), STATUS_OK);
    PREFIX(g, "x");
    YES(g, "x,x");
    YES(g, "x,x,x");
    NO(g, "x,x,x,");
    NO(g, "xx");
    grammar_put(g);
    /* unbounded, min 0 */
    gram_builder_init(&b);
    x = gram_rule_bytes(&b, "ab", 2);
    l = gram_repeat(&b, x, -1, 0, -1);
    assert_int_equal(gram_builder_finish(&b, l, &g, NULL), STATUS_OK);
    YES(g, "");
    YES(g, "abababababababababab");
    PREFIX(g, "aba");
    NO(g, "abb");
    grammar_put(g);
}

static void test_builder_refusals(void **state)
{
    (void)state;
    struct err err = {0};
    struct grammar *g = NULL;
    /* left recursion: E ::= E "+" "1" | "1" */
    struct gram_builder b;
    gram_builder_init(&b);
    int e = gram_rule(&b);
    int a = gram_alt(&b, e);
    gram_push_ref(&b, a, e);
    gram_push_bytes(&b, a, "+1", 2);
    gram_push_bytes(&b, gram_alt(&b, e), "1", 1);
    assert_int_equal(gram_builder_finish(&b, e, &g, &err), STATUS_INVALID);
    assert_non_null(strstr(err.msg, "left-recursive"));
    /* unproductive: R ::= "a" R (no way out) */
    gram_builder_init(&b);
    int r = gram_rule(&b);
    a = gram_alt(&b, r);
    gram_push_bytes(&b, a, "a", 1);
    gram_push_ref(&b, a, r);
    assert_int_equal(gram_builder_finish(&b, r, &g, &err), STATUS_INVALID);
    assert_non_null(strstr(err.msg, "no finite"));
    /* an unproductive alternative is pruned: S ::= "a" R | "b" */
    gram_builder_init(&b);
    int s = gram_rule(&b);
    r = gram_rule(&b);
    a = gram_alt(&b, r);
    gram_push_bytes(&b, a, "r", 1);
    gram_push_ref(&b, a, r);
    a = gram_alt(&b, s);
    gram_push_bytes(&b, a, "a", 1);
    gram_push_ref(&b, a, r);
    gram_push_bytes(&b, gram_alt(&b, s), "b", 1);
    assert_int_equal(gram_builder_finish(&b, s, &g, &err), STATUS_OK);
    NO(g, "a"); /* would never end */
    YES(g, "b");
    grammar_put(g);
    /* a bad reference fails the builder (sticky) */
    gram_builder_init(&b);
    s = gram_rule(&b);
    gram_push_ref(&b, gram_alt(&b, s), 99);
    assert_int_equal(gram_builder_finish(&b, s, &g, &err), STATUS_INVALID);
}

/* An ambiguous grammar past GRAMMAR_MAX_STACKS ways fails the matcher instead of truncating. */
static void test_matcher_ambiguity_bound(void **state)
{
    (void)state;
    /* S ::= A{0,600} "b" with A ::= "a" | "a": two ways per byte, deduplicated to one stack */
    struct gram_builder b;
    gram_builder_init(&b);
    int x = gram_rule(&b);
    gram_push_bytes(&b, gram_alt(&b, x), "a", 1);
    gram_push_bytes(&b, gram_alt(&b, x), "a", 1);
    int rep = gram_repeat(&b, x, -1, 0, 600);
    int s = gram_rule(&b);
    int a = gram_alt(&b, s);
    gram_push_ref(&b, a, rep);
    gram_push_bytes(&b, a, "b", 1);
    struct grammar *g = NULL;
    assert_int_equal(gram_builder_finish(&b, s, &g, NULL), STATUS_OK);
    char buf[700];
    memset(buf, 'a', 599);
    buf[599] = 'b';
    buf[600] = 0;
    YES(g, buf);
    grammar_put(g);
    /* S ::= "a" T, T ::= "x" | "x" | ... 600 times: 600 distinct stacks after "a" */
    gram_builder_init(&b);
    s = gram_rule(&b);
    int t = gram_rule(&b);
    a = gram_alt(&b, s);
    gram_push_bytes(&b, a, "a", 1);
    gram_push_ref(&b, a, t);
    for (int i = 0; i < 600; i++)
        gram_push_bytes(&b, gram_alt(&b, t), "x", 1);
    assert_int_equal(gram_builder_finish(&b, s, &g, NULL), STATUS_OK);
    struct grammar_matcher m;
    assert_int_equal(grammar_matcher_init(&m, g, NULL), STATUS_OK);
    assert_false(grammar_matcher_accept_bytes(&m, (const uint8_t *)"a", 1));
    assert_true(m.failed);
    grammar_matcher_free(&m);
    grammar_put(g);
    /* nesting: any JSON object, arrays inside arrays until the stack passes GRAMMAR_MAX_DEPTH frames */
    struct grammar_json_part any = {0};
    assert_int_equal(grammar_json_compile(&any, 1, NULL, &g, NULL), STATUS_OK);
    assert_int_equal(grammar_matcher_init(&m, g, NULL), STATUS_OK);
    assert_true(grammar_matcher_accept_bytes(&m, (const uint8_t *)"{\"a\":", 5));
    int depth = 0;
    while (depth < GRAMMAR_MAX_DEPTH && grammar_matcher_accept_bytes(&m, (const uint8_t *)"[", 1))
        depth++;
    assert_true(depth > 100 && depth < GRAMMAR_MAX_DEPTH); /* a few frames a level */
    assert_true(m.failed);
    assert_false(grammar_matcher_accept_bytes(&m, (const uint8_t *)"x", 1)); /* failed stays failed */
    grammar_matcher_free(&m);
    grammar_put(g);
}

static void test_json_scalars(void **state)
{
    (void)state;
    struct grammar *g = schema("{\"type\":\"integer\"}");
    YES(g, "0");
    YES(g, "-12");
    YES(g, "12345678901234567890");
    NO(g, "01");
    NO(g, "1.5");
    NO(g, "+1");
    NO(g, "123456789012345678901"); /* 21 digits: bounded so that a number ends */
    PREFIX(g, "-");
    grammar_put(g);
    g = schema("{\"type\":\"number\"}");
    YES(g, "0");
    YES(g, "-0.5");
    YES(g, "1e10");
    YES(g, "2.5E-3");
    NO(g, ".5");
    PREFIX(g, "1.");
    PREFIX(g, "1e");
    NO(g, "1e1234");
    NO(g, "NaN");
    grammar_put(g);
    g = schema("{\"type\":\"boolean\"}");
    YES(g, "true");
    YES(g, "false");
    NO(g, "True");
    grammar_put(g);
    g = schema("{\"type\":\"null\"}");
    YES(g, "null");
    NO(g, "nil");
    grammar_put(g);
    g = schema("{\"type\":[\"integer\",\"null\"]}");
    YES(g, "3");
    YES(g, "null");
    NO(g, "\"3\"");
    grammar_put(g);
    g = schema("{\"type\":\"string\",\"nullable\":true}");
    YES(g, "\"x\"");
    YES(g, "null");
    grammar_put(g);
}

static void test_json_strings(void **state)
{
    (void)state;
    struct grammar *g = schema("{\"type\":\"string\"}");
    YES(g, "\"\"");
    YES(g, "\"hello world\"");
    YES(g, "\"a\\\"b\\\\c\\n\\u00e9\"");
    YES(g, "\"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80\"");
    NO(g, "\"a\nb\"");              /* a raw control character */
    NO(g, "\"\\x\"");               /* not an escape */
    NO(g, "\"\xc3\x28\"");          /* broken UTF-8 */
    NO(g, "\"\xed\xa0\x80\"");      /* a surrogate */
    NO(g, "\"\xc0\xaf\"");          /* overlong */
    PREFIX(g, "\"caf\xc3");         /* half a character is a live prefix */
    NO(g, "\"a\"b");
    grammar_put(g);
    /* lengths count characters (code points, escapes) */
    g = schema("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
    NO(g, "\"a\"");
    YES(g, "\"ab\"");
    YES(g, "\"\xc3\xa9\xc3\xa9\xc3\xa9\"");
    YES(g, "\"\\n\\u0041b\"");
    NO(g, "\"abcd\"");
    grammar_put(g);
}

static void test_json_pattern(void **state)
{
    (void)state;
    /* anchored */
    struct grammar *g = schema("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,4}$\"}");
    YES(g, "\"AB-123\"");
    YES(g, "\"XY-1234\"");
    NO(g, "\"ab-123\"");
    NO(g, "\"AB-12\"");
    NO(g, "\"AB-12345\"");
    NO(g, "\"xAB-123\"");
    grammar_put(g);
    /* unanchored: contains */
    g = schema("{\"type\":\"string\",\"pattern\":\"ab|cd\"}");
    YES(g, "\"xxabyy\"");
    YES(g, "\"cd\"");
    YES(g, "\"\xc3\xa9" "cd\\n\"");
    NO(g, "\"ac\"");
    grammar_put(g);
    /* groups, ?, +, *, classes with escapes, negation, . and characters JSON escapes */
    g = schema("{\"type\":\"string\",\"pattern\":\"^(?:[a-c]+_)?x*[^0-9]\\\\.\\\"$\"}");
    YES(g, "\"abc_xxq.\\\"\"");
    YES(g, "\"\xc3\xa9.\\\"\"");  /* a non-ASCII character is not a digit */
    NO(g, "\"abc_xx5.\\\"\"");
    NO(g, "\"_q.\\\"\"");
    grammar_put(g);
    g = schema("{\"type\":\"string\",\"pattern\":\"^\\\\w\\\\s.\\\\u00e9$\"}");
    YES(g, "\"a b\xc3\xa9\"");
    YES(g, "\"_\\t\xe4\xb8\xad\xc3\xa9\"");
    NO(g, "\"a  e\"");
    grammar_put(g);
}

static void test_json_formats(void **state)
{
    (void)state;
    struct grammar *g = schema("{\"type\":\"string\",\"format\":\"date\"}");
    YES(g, "\"2024-02-29\"");
    YES(g, "\"1999-12-10\"");
    YES(g, "\"2000-01-31\"");
    NO(g, "\"2024-02-32\"");
    NO(g, "\"2024-13-01\"");
    NO(g, "\"2024-1-01\"");
    grammar_put(g);
    g = schema("{\"type\":\"string\",\"format\":\"date-time\"}");
    YES(g, "\"2024-02-29T23:59:59Z\"");
    YES(g, "\"2024-02-29T08:00:00.123+02:00\"");
    NO(g, "\"2024-02-29 08:00:00Z\"");
    NO(g, "\"2024-02-29T24:00:00Z\"");
    grammar_put(g);
    g = schema("{\"type\":\"string\",\"format\":\"time\"}");
    YES(g, "\"10:20:30Z\"");
    YES(g, "\"00:00:00-11:30\"");
    NO(g, "\"10:60:00Z\"");
    NO(g, "\"10:20Z\"");
    grammar_put(g);
    g = schema("{\"type\":\"string\",\"format\":\"uuid\"}");
    YES(g, "\"123e4567-e89b-12d3-a456-426614174000\"");
    NO(g, "\"123e4567e89b12d3a456426614174000\"");
    grammar_put(g);
    g = schema("{\"type\":\"string\",\"format\":\"email\"}");
    YES(g, "\"ada.lovelace+x@example.co.uk\"");
    NO(g, "\"ada@localhost\"");
    NO(g, "\"@example.org\"");
    grammar_put(g);
}

static void test_json_objects(void **state)
{
    (void)state;
    struct grammar *g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
                               "\"string\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"],"
                               "\"additionalProperties\":false}");
    YES(g, "{\"b\":\"x\"}");
    YES(g, "{\"a\":1,\"b\":\"x\",\"c\":true}");
    YES(g, "{\"a\": 1, \"b\": \"x\"}");
    YES(g, "{\n  \"b\": \"x\",\n  \"c\": false\n}");
    NO(g, "{}");                        /* b is required */
    NO(g, "{\"a\":1}");
    NO(g, "{\"b\":\"x\",\"d\":1}");      /* no other keys */
    NO(g, "{\"b\":\"x\",}");             /* no trailing comma */
    NO(g, "{\"c\":true,\"b\":\"x\"}");   /* the order of properties */
    NO(g, " {\"b\":\"x\"}");             /* nothing before the value */
    grammar_put(g);
    /* additionalProperties: a schema for the other keys */
    g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":"
               "{\"type\":\"boolean\"}}");
    YES(g, "{}");
    YES(g, "{\"a\":1,\"x\":true,\"y\":false}");
    YES(g, "{\"x\":true}");
    NO(g, "{\"a\":1,\"x\":2}");
    grammar_put(g);
    /* {"type": "object"} alone: any object */
    g = schema("{\"type\":\"object\"}");
    YES(g, "{\"k\":[1,{\"z\":null}],\"s\":\"v\"}");
    NO(g, "[]");
    grammar_put(g);
    /* json_object mode: no schema */
    struct grammar_json_part p = {0};
    assert_int_equal(grammar_json_compile(&p, 1, NULL, &g, NULL), STATUS_OK);
    YES(g, "{}");
    YES(g, "{\"a\": [true, false, null, -1.5e3, \"s\", {\"b\": {}}]}");
    NO(g, "[1]");
    NO(g, "\"s\"");
    grammar_put(g);
}

static void test_json_whitespace_bound(void **state)
{
    (void)state;
    struct grammar *g = schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}");
    char buf[64];
    snprintf(buf, sizeof buf, "[%*s1]", GRAMMAR_JSON_WS_MAX, "");
    YES(g, buf);
    snprintf(buf, sizeof buf, "[%*s1]", GRAMMAR_JSON_WS_MAX + 1, "");
    NO(g, buf);
    grammar_put(g);
    struct grammar_json_opts o = {.ws_max = -1};
    const char *t = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}";
    assert_int_equal(grammar_json_compile_text(t, strlen(t), &o, &g, NULL), STATUS_OK);
    YES(g, "[1,2]");
    NO(g, "[1, 2]");
    grammar_put(g);
}

static void test_json_arrays(void **state)
{
    (void)state;
    struct grammar *g = schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}");
    NO(g, "[]");
    YES(g, "[1]");
    YES(g, "[1, 2, 3]");
    NO(g, "[1,2,3,4]");
    NO(g, "[1,\"a\"]");
    grammar_put(g);
    g = schema("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}");
    YES(g, "[]");
    YES(g, "[\"a\"]");
    YES(g, "[\"a\", 2]");
    NO(g, "[\"a\", 2, 3]");
    NO(g, "[2]");
    grammar_put(g);
    g = schema("{\"type\":\"array\",\"prefixItems\":[{\"const\":\"x\"}],\"items\":{\"type\":\"null\"},\"minItems\":2}");
    NO(g, "[\"x\"]");
    YES(g, "[\"x\",null,null]");
    grammar_put(g);
    g = schema("{\"type\":\"array\"}");
    YES(g, "[1,\"a\",[],{}]");
    grammar_put(g);
}

static void test_json_enum_const_anyof(void **state)
{
    (void)state;
    struct grammar *g = schema("{\"enum\":[\"red\",\"green\",3,null,{\"k\":[1]}]}");
    YES(g, "\"red\"");
    YES(g, "\"green\"");
    YES(g, "3");
    YES(g, "null");
    YES(g, "{\"k\":[1]}");
    NO(g, "\"blue\"");
    grammar_put(g);
    g = schema("{\"const\":\"fixed \\\"value\\\"\"}");
    YES(g, "\"fixed \\\"value\\\"\"");
    NO(g, "\"fixed\"");
    grammar_put(g);
    g = schema("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\"}},"
               "\"required\":[\"x\"],\"additionalProperties\":false}]}");
    YES(g, "7");
    YES(g, "{\"x\":\"y\"}");
    NO(g, "\"7\"");
    grammar_put(g);
    g = schema("{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}],\"description\":\"d\"}");
    YES(g, "false");
    YES(g, "null");
    grammar_put(g);
}

static void test_json_refs(void **state)
{
    (void)state;
    struct grammar *g = schema("{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},"
                               "\"y\":{\"type\":\"integer\"}},\"required\":[\"x\",\"y\"],\"additionalProperties\":false}},"
                               "\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/pt\"},\"b\":{\"$ref\":"
                               "\"#/$defs/pt\"}},\"required\":[\"a\",\"b\"],\"additionalProperties\":false}");
    YES(g, "{\"a\":{\"x\":1,\"y\":2},\"b\":{\"x\":3,\"y\":4}}");
    NO(g, "{\"a\":{\"x\":1},\"b\":{\"x\":3,\"y\":4}}");
    grammar_put(g);
    /* recursion: a tree whose children are trees */
    g = schema("{\"definitions\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":"
               "{\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/node\"}}},\"required\":[\"v\",\"kids\"],"
               "\"additionalProperties\":false}},\"$ref\":\"#/definitions/node\"}");
    YES(g, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}");
    NO(g, "{\"v\":1,\"kids\":[{\"v\":2}]}");
    grammar_put(g);
    /* "#": the root itself */
    g = schema("{\"type\":\"object\",\"properties\":{\"next\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},"
               "\"required\":[\"next\"],\"additionalProperties\":false}");
    YES(g, "{\"next\":{\"next\":{\"next\":null}}}");
    grammar_put(g);
}

static void test_json_prefix_suffix_parts(void **state)
{
    (void)state;
    struct json *s1 = NULL, *s2 = NULL;
    const char *t1 = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],"
                     "\"additionalProperties\":false}";
    const char *t2 = "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"],"
                     "\"additionalProperties\":false}";
    assert_int_equal(json_parse(t1, strlen(t1), "t1", &s1, NULL), STATUS_OK);
    assert_int_equal(json_parse(t2, strlen(t2), "t2", &s2, NULL), STATUS_OK);
    struct grammar_json_part parts[2] = {
        {.prefix = "<tool_call>\n{\"name\": \"weather\", \"arguments\": ", .schema = s1, .suffix = "}\n</tool_call>"},
        {.prefix = "<tool_call>\n{\"name\": \"count\", \"arguments\": ", .schema = s2, .suffix = "}\n</tool_call>"},
    };
    struct grammar *g = NULL;
    assert_int_equal(grammar_json_compile(parts, 2, NULL, &g, NULL), STATUS_OK);
    YES(g, "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    YES(g, "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"n\": 3}}\n</tool_call>");
    NO(g, "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    NO(g, "<tool_call>\n{\"name\": \"other\"");
    grammar_put(g);
    json_free(s1);
    json_free(s2);
}

static void test_json_refusals(void **state)
{
    (void)state;
    refused("{\"type\":\"integer\",\"minimum\":1}", STATUS_UNSUPPORTED, "schema: 'minimum' is not supported");
    refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?=a)b\"}}}", STATUS_UNSUPPORTED,
            "schema.properties.a: 'pattern' \"(?=a)b\": lookaround");
    refused("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", STATUS_UNSUPPORTED, "escape is not supported");
    refused("{\"type\":\"string\",\"pattern\":\"a+?\"}", STATUS_UNSUPPORTED, "lazy");
    refused("{\"type\":\"string\",\"pattern\":\"a^b\"}", STATUS_UNSUPPORTED, "anchor");
    refused("{\"type\":\"string\",\"pattern\":\"(ab\"}", STATUS_INVALID, "not closed");
    refused("{\"type\":\"string\",\"pattern\":\"a{2000}\"}", STATUS_INVALID, "above 1000");
    refused("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", STATUS_UNSUPPORTED, "together");
    refused("{\"type\":\"object\",\"patternProperties\":{}}", STATUS_UNSUPPORTED, "'patternProperties'");
    refused("{\"allOf\":[{\"type\":\"string\"}]}", STATUS_UNSUPPORTED, "'allOf'");
    refused("{\"not\":{}}", STATUS_UNSUPPORTED, "'not'");
    refused("{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}", STATUS_UNSUPPORTED,
            "'uniqueItems'");
    refused("{\"type\":\"string\",\"format\":\"ipv4\"}", STATUS_UNSUPPORTED, "'format' \"ipv4\"");
    refused("{\"$ref\":\"https://example.org/s.json\"}", STATUS_UNSUPPORTED, "'$ref'");
    refused("{\"$ref\":\"#/$defs/none\"}", STATUS_INVALID, "names nothing");
    refused("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", STATUS_UNSUPPORTED,
            "'required' names \"b\"");
    refused("{\"type\":\"strin\"}", STATUS_INVALID, "'type' \"strin\"");
    refused("{\"type\":\"array\",\"minItems\":-1}", STATUS_INVALID, "'minItems' must be a non-negative integer");
    refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", STATUS_INVALID, "below 'minItems'");
    refused("{\"enum\":[]}", STATUS_INVALID, "'enum' must be a non-empty array");
    refused("false", STATUS_UNSUPPORTED, "false");
    refused("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}", STATUS_INVALID,
            "no finite");
    refused("{\"a\":1,\"a\":2}", STATUS_INVALID, "twice");
    refused("[1", STATUS_FORMAT, "schema");
    /* bounds: a huge maxLength, deep nesting */
    refused("{\"type\":\"string\",\"maxLength\":100000000}", STATUS_INVALID, "larger than");
    refused("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":60000},\"maxItems\":60000}", STATUS_INVALID,
            "elements");
    char deep[2048] = "";
    size_t n = 0;
    for (int i = 0; i < GRAMMAR_JSON_MAX_DEPTH + 2; i++)
        n += (size_t)snprintf(deep + n, sizeof deep - n, "{\"type\":\"array\",\"items\":");
    n += (size_t)snprintf(deep + n, sizeof deep - n, "{}");
    for (int i = 0; i < GRAMMAR_JSON_MAX_DEPTH + 2; i++)
        n += (size_t)snprintf(deep + n, sizeof deep - n, "}");
    refused(deep, STATUS_INVALID, "deeper than");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builder_basics),        cmocka_unit_test(test_builder_repeat_sep),
        cmocka_unit_test(test_builder_refusals),      cmocka_unit_test(test_matcher_ambiguity_bound),
        cmocka_unit_test(test_json_scalars),          cmocka_unit_test(test_json_strings),
        cmocka_unit_test(test_json_formats),          cmocka_unit_test(test_json_objects),
        cmocka_unit_test(test_json_pattern),
        cmocka_unit_test(test_json_whitespace_bound), cmocka_unit_test(test_json_arrays),
        cmocka_unit_test(test_json_enum_const_anyof), cmocka_unit_test(test_json_refs),
        cmocka_unit_test(test_json_prefix_suffix_parts), cmocka_unit_test(test_json_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
