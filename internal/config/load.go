package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// LookupEnv looks up an environment variable; os.LookupEnv is one. Load
// takes it as a parameter so tests need not touch the process environment.
type LookupEnv func(name string) (value string, ok bool)

// Load reads, decodes, defaults and validates the configuration file at path
// for a process of the given role. If anything is wrong, the error is a
// Problems listing every problem found (and every warning); an unreadable
// file is a plain error. A file that loads may still carry Warnings.
func Load(path string, role Role, env LookupEnv) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	return Parse(path, data, role, env)
}

// Parse is Load for a file already read: name is used in problems and its
// directory resolves relative paths in the file. On success, a contract's
// JSON Schema file has been read into JSONSchema.Document and
// redis.tls.ca_file holds the resolved path.
func Parse(name string, data []byte, role Role, env LookupEnv) (*Config, error) {
	return parseFile(name, data, role, env, false)
}

// LoadForNATSUsers loads path as serve would, for `hedgerow nats-auth`,
// which reads only the routes, policies, gate bucket and records stream:
// the secrets the file names need not be set where the users are
// generated, and a nats.listen still without the users
// (ErrOpenListener) is what the generator is run to fix.
func LoadForNATSUsers(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	return parseFile(path, data, RoleServe, func(string) (string, bool) { return "set", true }, true)
}

// parseFile is Parse; usersPending skips the check that a serve listener has
// its users (LoadForNATSUsers).
func parseFile(name string, data []byte, role Role, env LookupEnv, usersPending bool) (*Config, error) {
	if _, err := ParseRole(string(role)); err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	r := newReporter(name)
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		r.problems = append(r.problems, syntaxProblem(name, data, err))
		return nil, r.problems
	}
	c := &Config{File: name}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	if root.Kind == 0 {
		r.addf("", "the file is empty")
		return nil, r.problems
	}
	d := &decoder{reporter: r}
	d.decode(root, "", 0, reflect.ValueOf(c).Elem())

	if err := applyDefaults(c, r.has); err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	v := &validator{reporter: r, cfg: c, dir: filepath.Dir(name), role: role, env: env, usersPending: usersPending}
	v.validate()

	if len(r.problems) > 0 {
		all := append(r.problems, r.warnings...)
		all.sort()
		return nil, all
	}
	r.warnings.sort()
	c.Warnings = r.warnings
	return c, nil
}

var yamlLineError = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxProblem turns a YAML syntax error into a Problem at the line where
// the file stops being YAML. yaml.v3 names the line where the construct
// holding the error began — for a key indented unlike its siblings, the
// first line of the enclosing mapping or list, line 1 for a file that opens
// with it — so the line is found again: the first line from the reported
// one on (the error is never before the construct holding it) at which the
// file read up to there fails with the same error.
func syntaxProblem(file string, data []byte, err error) Problem {
	m := yamlLineError.FindStringSubmatch(err.Error())
	if m == nil {
		return Problem{File: file, Message: "invalid YAML: " + err.Error()}
	}
	reported, _ := strconv.Atoi(m[1])
	msg := m[2]
	line := failingLine(data, reported, msg)
	if line == 0 {
		line = reported
	}
	if strings.HasPrefix(msg, "did not find expected key") || strings.HasPrefix(msg, "did not find expected '-' indicator") {
		msg += " (check this line's indentation against the keys above it)"
	}
	return Problem{File: file, Line: line, Message: "invalid YAML: " + msg}
}

// failingLine returns the first line n ≥ from such that data's first n
// lines fail to parse with the error msg, or 0 when the whole file does
// not. Once the line that breaks the file is in, every longer prefix fails
// with its error (the parser stops there, reading the same lines up to
// it), and a shorter prefix is valid YAML or fails otherwise (cut inside
// a flow list, say), so the line is found by bisection: a handful of
// parses, whatever the file's length.
func failingLine(data []byte, from int, msg string) int {
	var ends []int // ends[n-1]: the length of the first n lines
	for i, b := range data {
		if b == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(ends) == 0 || ends[len(ends)-1] != len(data) {
		ends = append(ends, len(data))
	}
	fails := func(n int) bool {
		var doc yaml.Node
		err := yaml.Unmarshal(data[:ends[n-1]], &doc)
		if err == nil {
			return false
		}
		m := yamlLineError.FindStringSubmatch(err.Error())
		return m != nil && m[2] == msg
	}
	lo, hi := max(from, 1), len(ends)
	if lo > hi || !fails(hi) {
		return 0
	}
	for lo < hi {
		if mid := (lo + hi) / 2; fails(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}
