package config

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Problem is one thing wrong with a configuration file.
type Problem struct {
	File string
	// Line is the 1-based line the problem is found at; 0 when unknown.
	Line int
	// Path is the field path, e.g. "policies.default.delay.quantile" or
	// "routes[2].name"; empty for problems of the whole file.
	Path    string
	Message string
	// Err, when set, is the error the problem stands for (Message is its
	// text), so that callers can tell it with errors.Is — the same error a
	// process refusing the setting at start returns.
	Err error
	// Warning marks a setting that loads but is almost surely not what was
	// meant (an example's placeholder left in place): reported, never
	// refused.
	Warning bool
}

// String formats the problem as "file:line: path: message".
func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		b.WriteString(":" + strconv.Itoa(p.Line))
	}
	b.WriteString(": ")
	if p.Path != "" {
		b.WriteString(p.Path + ": ")
	}
	if p.Warning {
		b.WriteString("warning: ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// Problems is every problem found in a configuration file. Load returns it as
// its error so callers can print each one; it then holds the file's
// warnings too, in line order with the rest.
type Problems []Problem

// Refusals counts the problems that are not warnings: what refuses the file.
func (ps Problems) Refusals() int {
	n := 0
	for _, p := range ps {
		if !p.Warning {
			n++
		}
	}
	return n
}

// Error lists the problems one per line.
func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Unwrap is the errors the problems stand for (Problem.Err), for errors.Is.
func (ps Problems) Unwrap() []error {
	var errs []error
	for _, p := range ps {
		if p.Err != nil {
			errs = append(errs, p.Err)
		}
	}
	return errs
}

func (ps Problems) sort() {
	slices.SortStableFunc(ps, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Path, b.Path))
	})
}

// reporter collects problems, placing each at the line of its path or of the
// nearest enclosing path the file contains. Problems under a path whose value
// could not be decoded are dropped: the decode problem already says it, and
// the zero value left behind would only add noise.
type reporter struct {
	file     string
	lines    map[string]int  // every path present in the file → its line
	bad      map[string]bool // paths whose value failed to decode
	problems Problems
	warnings Problems
}

func newReporter(file string) *reporter {
	return &reporter{file: file, lines: map[string]int{}, bad: map[string]bool{}}
}

func (r *reporter) addf(path, format string, args ...any) {
	r.add(path, fmt.Sprintf(format, args...), nil)
}

// warnf reports a warning at path: the file loads, but not as meant.
func (r *reporter) warnf(path, format string, args ...any) {
	r.warnings = append(r.warnings, Problem{
		File: r.file, Line: r.line(path), Path: path, Message: fmt.Sprintf(format, args...), Warning: true,
	})
}

// addErr reports err as a problem at path, keeping err for errors.Is.
func (r *reporter) addErr(path string, err error) { r.add(path, err.Error(), err) }

func (r *reporter) add(path, msg string, err error) {
	for p := path; p != ""; p = parentPath(p) {
		if r.bad[p] {
			return
		}
	}
	r.problems = append(r.problems, Problem{
		File: r.file, Line: r.line(path), Path: path, Message: oneLine(msg), Err: err,
	})
}

// oneLine folds a multi-line message (such as a schema compiler's error
// tree) into one line, so that every problem prints as exactly one line.
func oneLine(msg string) string {
	if !strings.Contains(msg, "\n") {
		return msg
	}
	var parts []string
	for l := range strings.Lines(msg) {
		if l = strings.TrimLeft(strings.TrimSpace(l), "- "); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "; ")
}

// decodeFailed records a problem with a value and marks its path bad.
func (r *reporter) decodeFailed(path string, line int, format string, args ...any) {
	r.problems = append(r.problems, Problem{
		File: r.file, Line: line, Path: path, Message: oneLine(fmt.Sprintf(format, args...)),
	})
	r.bad[path] = true
}

func (r *reporter) line(path string) int {
	for p := path; ; p = parentPath(p) {
		if l, ok := r.lines[p]; ok {
			return l
		}
		if p == "" {
			return 0
		}
	}
}

// has reports whether the file gave path a (non-null) value.
func (r *reporter) has(path string) bool {
	_, ok := r.lines[path]
	return ok
}

func parentPath(p string) string {
	i := strings.LastIndexAny(p, ".[")
	if i < 0 {
		return ""
	}
	return p[:i]
}

func joinPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}
