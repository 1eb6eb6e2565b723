// Package redact removes credentials from text a process prints: the
// userinfo of URLs (nats://user:password@host, redis://:password@host,
// http://user:token@host), in URLs themselves and in the text of errors that
// quote them — url.Parse and nats.Connect both quote the raw URL they were
// given. docs/architecture.md §9: credentials never reach logs or errors.
package redact

import (
	"regexp"
	"strings"
)

// Mask replaces a password (or a token given as the whole userinfo).
const Mask = "xxxxx"

// userinfo matches "://userinfo@". It stops at a slash or whitespace but
// not at '@' or ':', so a password holding unescaped '@' is still masked up
// to the last '@' before the host (over-masking a run of several URLs is
// acceptable, printing any of a password is not). A bare double quote ends
// it (the end of a URL an error quotes), but not one escaped as an error's
// %q writes it, nor a single quote: a password may hold either.
var userinfo = regexp.MustCompile(`://((?:[^/\s"<>]|\\")*)@`)

// Text masks the userinfo of every URL in s: a user name is kept, its
// password becomes Mask; userinfo without a colon is a token and is masked
// whole.
func Text(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	return userinfo.ReplaceAllStringFunc(s, func(m string) string {
		info := m[len("://") : len(m)-len("@")]
		if user, _, ok := strings.Cut(info, ":"); ok {
			return "://" + user + ":" + Mask + "@"
		}
		return "://" + Mask + "@"
	})
}

// URL is Text for one URL, which need not parse.
func URL(u string) string { return Text(u) }

// URLs joins urls with commas, each masked.
func URLs(urls []string) string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = Text(u)
	}
	return strings.Join(out, ",")
}

// Error returns err with its text masked by Text; nil stays nil. errors.Is
// and errors.As still see err (an *url.Error found that way holds the raw
// URL: print the returned error, not what As finds).
func Error(err error) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	masked := Text(text)
	if masked == text {
		return err
	}
	return &maskedError{text: masked, err: err}
}

type maskedError struct {
	text string
	err  error
}

func (e *maskedError) Error() string { return e.text }
func (e *maskedError) Unwrap() error { return e.err }
