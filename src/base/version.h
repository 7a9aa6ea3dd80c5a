/* version.h — the release this source tree is (GET /version, `moeserve --version`).
 *
 * defines: MOESERVE_VERSION
 */
#ifndef MOESERVE_BASE_VERSION_H
#define MOESERVE_BASE_VERSION_H

#define MOESERVE_VERSION "0.1.0"

#endif
