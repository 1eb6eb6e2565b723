package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// LookupEnv looks up an environment variable; os.LookupEnv is one. Load
// takes it as a parameter so tests need not touch the process environment.
type LookupEnv func(name string) (value string, ok bool)

// Load reads, decodes, defaults and validates the configuration file at path
// for a process of the given role. If anything is wrong, the error is a
// Problems listing every problem found; an unreadable file is a plain error.
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
		r.problems = append(r.problems, syntaxProblem(name, err))
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
		r.problems.sort()
		return nil, r.problems
	}
	return c, nil
}

var yamlLineError = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxProblem turns a YAML syntax error into a Problem at its line.
func syntaxProblem(file string, err error) Problem {
	msg := err.Error()
	if m := yamlLineError.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return Problem{File: file, Line: line, Message: "invalid YAML: " + m[2]}
	}
	return Problem{File: file, Message: "invalid YAML: " + msg}
}
