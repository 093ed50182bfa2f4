/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* Debian's libinih is built with INI_HANDLER_LINENO=1 (the handler gets a fifth argument) and with
 * runtime options (ini_max_line & co. are variables): declare the handler to match what it calls. */
#define INI_HANDLER_LINENO 1
#include <ini.h>

#include "config-files.h"
#include "strv.h"

typedef struct Parser {
        BrokerConfig *config;
        ConfErrors *errors;
        const char *name;
        const char *data;
        size_t size;
        size_t pos;
        unsigned line;          /* of the line last handed to inih: its handler runs before the next read */
        char *section;          /* in full: inih cuts section names at 49 bytes */
        bool section_ok;        /* false after a bad header: its keys are skipped, the header was reported */
        bool failed;            /* some line was refused (errors may be NULL, so count here) */
        int r;                  /* -ENOMEM, which no later line can make good */
} Parser;

static bool key_char(char c) {
        return isascii((unsigned char) c) && (isalnum((unsigned char) c) || strchr("._-", c));
}

/* Starts a section; the header is consumed here, inih never sees it. */
static void parser_section(Parser *p, const char *line, size_t len, const ConfSource *src) {
        const char *end = memchr(line, ']', len);

        if (!end) {
                conf_errors_add(p->errors, src, NULL, "section header without ] (expected [broker], [pool NAME] or [lane NAME])");
                p->failed = true;
                goto bad;
        }
        const char *rest = end + 1;
        while (rest < line + len && isspace((unsigned char) *rest))
                rest++;
        if (rest < line + len && *rest != ';' && *rest != '#') {
                conf_errors_add(p->errors, src, NULL, "unexpected text after the section header's ]");
                p->failed = true;
                goto bad;
        }

        const char *s = line + 1;
        while (s < end && isspace((unsigned char) *s))
                s++;
        while (end > s && isspace((unsigned char) end[-1]))
                end--;
        char *section = strndup(s, (size_t) (end - s));
        if (!section) {
                p->r = -ENOMEM;
                goto bad;
        }
        free(p->section);
        p->section = section;
        int r = conf_section_add(p->config, section, src, p->errors);
        if (r == -ENOMEM)
                p->r = r;
        p->failed = p->failed || r < 0;
        p->section_ok = r >= 0;
        return;
bad:
        /* Keys under a header we could not read would land in the previous section. */
        p->section = mfree(p->section);
        p->section_ok = false;
}

/* inih's fgets(): hands over one line at a time, so that p->line is the line of every handler call, and
 * checks what inih would accept silently or report only once (long lines, bad headers, lines without =).
 * Only KEY=VALUE lines reach inih; everything else becomes an empty line. */
static char *parser_read(char *buf, int num, void *userdata) {
        Parser *p = userdata;
        ConfSource src = { .file = (char *) p->name };

        if (p->pos >= p->size)
                return NULL;

        const char *line = p->data + p->pos;
        const char *nl = memchr(line, '\n', p->size - p->pos);
        size_t len = nl ? (size_t) (nl - line) : p->size - p->pos;
        p->pos += len + !!nl;
        src.line = ++p->line;

        if (p->line == 1 && len >= 3 && memcmp(line, "\xef\xbb\xbf", 3) == 0) {
                line += 3;
                len -= 3;
        }
        while (len > 0 && isspace((unsigned char) line[0])) {
                line++;
                len--;
        }
        while (len > 0 && isspace((unsigned char) line[len - 1]))
                len--;

        strcpy(buf, "\n");
        if (len == 0 || line[0] == '#' || line[0] == ';')
                return buf;
        if (len > CONFIG_LINE_MAX || len + 2 > (size_t) num) {
                conf_errors_add(p->errors, &src, NULL, "line is longer than %d bytes", CONFIG_LINE_MAX);
                p->failed = true;
                return buf;
        }
        if (line[0] == '[') {
                parser_section(p, line, len, &src);
                return buf;
        }

        const char *eq = memchr(line, '=', len);
        if (!eq) {
                conf_errors_add(p->errors, &src, NULL, "expected KEY=VALUE, a [section] header or a comment");
                p->failed = true;
                return buf;
        }
        size_t klen = (size_t) (eq - line);
        while (klen > 0 && isspace((unsigned char) line[klen - 1]))
                klen--;
        if (klen == 0) {
                conf_errors_add(p->errors, &src, NULL, "missing key before = (expected KEY=VALUE)");
                p->failed = true;
                return buf;
        }
        for (size_t i = 0; i < klen; i++)
                if (!key_char(line[i])) {
                        conf_errors_add(p->errors, &src, NULL, "invalid key \"%.*s\" (expected KEY=VALUE, keys like queue-timeout)",
                                        (int) MIN(klen, (size_t) 64), line);
                        p->failed = true;
                        return buf;
                }

        memcpy(buf, line, len);
        buf[len] = '\n';
        buf[len + 1] = '\0';
        return buf;
}

static int parser_handle(void *userdata, const char *section, const char *key, const char *value, int lineno) {
        Parser *p = userdata;
        ConfSource src = { .file = (char *) p->name, .line = p->line };

        /* inih's section and lineno are ignored: ours are complete and counted by parser_read(). */
        if (!p->section_ok)
                return 1;
        int r = conf_set(p->config, p->section ?: "", key, value ?: "", &src, p->errors);
        if (r == -ENOMEM)
                p->r = r;
        p->failed = p->failed || r < 0;
        return 1;
}

/* A file we cannot read is told apart from one with errors in it: see config_load_full(). */
#define unreadable(errors, src, ...)                                          \
        ({                                                                    \
                (void) conf_errors_add((errors), (src), NULL, __VA_ARGS__);   \
                -EIO;                                                         \
        })

int config_parse_buffer(BrokerConfig *c, const char *data, size_t size, const char *name, ConfErrors *errors) {
        ConfSource src = { .file = (char *) name };

        assert_return(c, -EINVAL);
        assert_return(data || size == 0, -EINVAL);
        assert_return(name, -EINVAL);

        /* Refused whole, as a file that cannot be read is: -EIO, so that the caller does not validate what is
         * left without it (see config_load_full()). */
        if (size > CONFIG_FILE_SIZE_MAX)
                return unreadable(errors, &src, "file is larger than %zu bytes", CONFIG_FILE_SIZE_MAX);
        const char *nul = memchr(data ?: "", '\0', size);
        if (nul) {
                src.line = 1;
                for (const char *i = data; i < nul; i++)
                        src.line += *i == '\n';
                return unreadable(errors, &src, "contains a NUL byte (not a text file?)");
        }

        Parser p = {
                .config = c,
                .errors = errors,
                .name = name,
                .data = data ?: "",
                .size = size,
                .section_ok = true,
        };
        /* inih's options are process-wide variables: set what this parser relies on, and put them back.
         * The line buffer is on the heap, large enough for any line parser_read() lets through. */
        bool use_stack = ini_use_stack, allow_realloc = ini_allow_realloc, inline_comments = ini_allow_inline_comments,
             no_value = ini_allow_no_value, stop_on_first = ini_stop_on_first_error;
        int max_line = ini_max_line, initial_alloc = ini_initial_alloc;
        char *inline_prefixes = ini_inline_comment_prefixes;

        ini_use_stack = false;
        ini_allow_realloc = false;
        ini_max_line = ini_initial_alloc = CONFIG_LINE_MAX + 3;
        ini_allow_inline_comments = true;
        ini_inline_comment_prefixes = (char *) ";";
        ini_allow_no_value = false;
        ini_stop_on_first_error = false;

        int k = ini_parse_stream(parser_read, &p, parser_handle, &p);

        ini_use_stack = use_stack;
        ini_allow_realloc = allow_realloc;
        ini_max_line = max_line;
        ini_initial_alloc = initial_alloc;
        ini_allow_inline_comments = inline_comments;
        ini_inline_comment_prefixes = inline_prefixes;
        ini_allow_no_value = no_value;
        ini_stop_on_first_error = stop_on_first;

        free(p.section);
        if (k == -2 || p.r == -ENOMEM) {
                (void) conf_errors_add(errors, &src, NULL, "out of memory");
                return -ENOMEM;
        }
        if (k > 0 && !p.failed) {
                /* parser_read() lets through only lines inih accepts; should that ever change, still fail. */
                src.line = (unsigned) k;
                return conf_errors_add(errors, &src, NULL, "syntax error");
        }
        return p.failed || k != 0 ? -EINVAL : 0;
}

/* Reads a whole configuration file. Returns 0, -ENOENT when it does not exist and may be missing (no error
 * recorded), -EIO with the error recorded, or -ENOMEM. */
static int read_file(const char *path, bool required, char **ret_data, size_t *ret_size, ConfErrors *errors) {
        ConfSource src = { .file = (char *) path };
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t size = 0;

        /* O_NONBLOCK: a FIFO in place of the file must not hang the daemon; it is refused below. */
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0) {
                int r = -errno;
                if (r == -ENOENT && !required)
                        return -ENOENT;
                return unreadable(errors, &src, "cannot open: %s", strerror(-r));
        }
        if (fstat(fd, &st) < 0)
                return unreadable(errors, &src, "cannot stat: %s", strerror(errno));
        /* A drop-in linked to /dev/null masks nothing and says nothing: read as empty. */
        if (S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3)
                goto done;
        if (S_ISDIR(st.st_mode))
                return unreadable(errors, &src, "is a directory, not a configuration file");
        if (!S_ISREG(st.st_mode))
                return unreadable(errors, &src, "is not a regular file");
        if ((uint64_t) st.st_size > CONFIG_FILE_SIZE_MAX)
                return unreadable(errors, &src, "file is larger than %zu bytes", CONFIG_FILE_SIZE_MAX);

        /* st_size is a hint only: the file may grow while we read, so read to the cap plus one byte. */
        buf = malloc(CONFIG_FILE_SIZE_MAX + 1);
        if (!buf)
                return -ENOMEM;
        while (size <= CONFIG_FILE_SIZE_MAX) {
                ssize_t n = read(fd, buf + size, CONFIG_FILE_SIZE_MAX + 1 - size);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return unreadable(errors, &src, "cannot read: %s", strerror(errno));
                }
                if (n == 0)
                        break;
                size += (size_t) n;
        }
        if (size > CONFIG_FILE_SIZE_MAX)
                return unreadable(errors, &src, "file is larger than %zu bytes", CONFIG_FILE_SIZE_MAX);
done:
        *ret_data = TAKE_PTR(buf);
        *ret_size = size;
        return 0;
}

static int config_apply_file(BrokerConfig *c, const char *path, bool required, ConfErrors *errors) {
        _cleanup_free_ char *data = NULL;
        size_t size = 0;

        int r = read_file(path, required, &data, &size, errors);
        if (r < 0)
                return r;
        return config_parse_buffer(c, data, size, path, errors);
}

static int compare_strings(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

/* The *.conf files of dir, as full paths in lexical order of their names (hidden files skipped). A
 * missing directory has none. Returns 0, or -EINVAL/-ENOMEM with an error recorded. */
static int dropins_list(const char *dir, char ***ret, size_t *ret_n, ConfErrors *errors) {
        ConfSource src = { .file = (char *) dir };
        char **l = NULL, **names = NULL;
        size_t n = 0;
        int r = 0;

        DIR *d = opendir(dir);
        if (!d) {
                if (errno == ENOENT) {
                        *ret = NULL;
                        *ret_n = 0;
                        return 0;
                }
                return conf_errors_add(errors, &src, NULL, "cannot open drop-in directory: %s", strerror(errno));
        }
        for (;;) {
                errno = 0;
                struct dirent *de = readdir(d);
                if (!de) {
                        if (errno != 0)
                                r = conf_errors_add(errors, &src, NULL, "cannot read drop-in directory: %s",
                                                    strerror(errno));
                        break;
                }
                size_t len = strlen(de->d_name);
                if (de->d_name[0] == '.' || len <= 5 || !streq(de->d_name + len - 5, ".conf"))
                        continue;
                char **nn = realloc(names, (n + 2) * sizeof(char *));
                if (!nn) {
                        r = -ENOMEM;
                        break;
                }
                names = nn;
                names[n] = strdup(de->d_name);
                if (!names[n]) {
                        r = -ENOMEM;
                        break;
                }
                names[++n] = NULL;
        }
        closedir(d);
        if (r < 0)
                goto finish;

        if (n > 0)
                qsort(names, n, sizeof(char *), compare_strings);
        l = calloc(n + 1, sizeof(char *));
        if (!l) {
                r = -ENOMEM;
                goto finish;
        }
        for (size_t i = 0; i < n; i++)
                if (asprintf(&l[i], "%s/%s", dir, names[i]) < 0) {
                        l[i] = NULL;
                        r = -ENOMEM;
                        goto finish;
                }
        *ret = TAKE_PTR(l);
        *ret_n = n;
finish:
        strv_free(l);
        strv_free(names);
        if (r == -ENOMEM)
                (void) conf_errors_add(errors, &src, NULL, "out of memory");
        return r;
}

int config_load_full(const char *main_path, const char *dropin_dir, ConfigLoadFlags flags, unsigned n_cpus,
                     BrokerConfig **ret, ConfErrors *errors) {
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        char **dropins = NULL;
        size_t n_dropins = 0;
        bool any = false, unread = false;
        int r, ret_r = 0;

        assert_return(main_path, -EINVAL);
        assert_return(ret, -EINVAL);

        if (dropin_dir) {
                r = dropins_list(dropin_dir, &dropins, &n_dropins, errors);
                if (r == -ENOMEM)
                        return r;
                if (r < 0) {
                        /* Reported; the main file is still read, for its own errors. */
                        any = unread = true;
                        ret_r = -EINVAL;
                }
        }

        r = conf_new(&c);
        if (r < 0)
                goto finish;

        /* Every file is read even after an error, so that one run reports every problem. */
        r = config_apply_file(c, main_path, flags & CONFIG_MAIN_REQUIRED, errors);
        if (r == -ENOMEM)
                goto finish;
        if (r != -ENOENT) {
                any = true;
                unread = unread || r == -EIO;
                if (r < 0)
                        ret_r = -EINVAL;
        }
        for (size_t i = 0; i < n_dropins; i++) {
                r = config_apply_file(c, dropins[i], true, errors);
                if (r == -ENOMEM)
                        goto finish;
                unread = unread || r == -EIO;
                if (r < 0)
                        ret_r = -EINVAL;
                any = true;
        }

        if (!any) {
                if (n_cpus == 0) {
                        long k = sysconf(_SC_NPROCESSORS_ONLN);
                        n_cpus = k > 0 ? (unsigned) MIN(k, (long) CONF_LIMIT_MAX) : 1;
                }
                c = conf_free(c);
                r = conf_new_default(n_cpus, &c);
                if (r < 0)
                        goto finish;
        }

        /* A file that could not be read at all would only add noise ("no lane is configured"). */
        r = unread ? 0 : conf_validate(c, errors);
        if (r < 0 || ret_r < 0) {
                r = -EINVAL;
                goto finish;
        }
        *ret = TAKE_PTR(c);
        r = 0;
finish:
        strv_free(dropins);
        if (r == -ENOMEM)
                (void) conf_errors_add(errors, NULL, NULL, "out of memory");
        return r;
}

int config_load(const char *path, BrokerConfig **ret, ConfErrors *errors) {
        _cleanup_free_ char *dropin_dir = NULL;
        const char *main_path = path ?: CONFIG_MAIN_PATH;

        assert_return(ret, -EINVAL);

        if (asprintf(&dropin_dir, "%s.d", main_path) < 0) {
                dropin_dir = NULL;
                return -ENOMEM;
        }
        return config_load_full(main_path, dropin_dir, path ? CONFIG_MAIN_REQUIRED : 0, 0, ret, errors);
}

int config_load_buffer(const char *data, size_t size, const char *name, BrokerConfig **ret, ConfErrors *errors) {
        _cleanup_(conf_freep) BrokerConfig *c = NULL;

        assert_return(ret, -EINVAL);

        int r = conf_new(&c);
        if (r < 0)
                return r;
        r = config_parse_buffer(c, data, size, name ?: "(string)", errors);
        if (r == -ENOMEM)
                return r;
        if (r == -EIO)
                return -EINVAL; /* nothing of it was read: validating nothing would only add noise */
        /* Validated even after parse errors: one run reports every problem. */
        int k = conf_validate(c, errors);
        if (r < 0 || k < 0)
                return -EINVAL;
        *ret = TAKE_PTR(c);
        return 0;
}

int config_load_string(const char *text, const char *name, BrokerConfig **ret, ConfErrors *errors) {
        assert_return(text, -EINVAL);
        return config_load_buffer(text, strlen(text), name, ret, errors);
}
