/* log.h — messages for people, on stderr (stdout is reserved for results).
 *
 * One process-wide verbosity, set once by main() from --quiet/--verbose; it is
 * the only mutable global of base/ and is only read elsewhere.
 *
 * defines: enum log_level, log_set_level(), log_msg(), LOG_INFO/WARN/ERROR/DEBUG
 */
#ifndef MOESERVE_BASE_LOG_H
#define MOESERVE_BASE_LOG_H

enum log_level { LOG_LEVEL_ERROR, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

void log_set_level(enum log_level level);
enum log_level log_get_level(void);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_ERROR(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define LOG_WARN(...) log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_INFO(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
