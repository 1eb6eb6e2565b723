package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fuzzSecret is the value of every environment variable the fuzzed files
// name, and the password of the seeds' URLs: a secret, which no problem may
// print.
const fuzzSecret = "s3cr3t-canary"

// checkParse fails t unless Parse either accepts src or refuses it with
// Problems (never another error, never a config with them), each problem one
// line, placed in the file at a line it has, sorted by line, and none
// printing a secret: not the value of an environment variable, not a URL's
// password.
func checkParse(t *testing.T, src []byte) {
	t.Helper()
	const name = "fuzz.yaml"
	env := func(string) (string, bool) { return fuzzSecret, true }
	c, err := Parse(name, src, RoleServe, env)
	if err == nil {
		if c == nil {
			t.Fatalf("Parse(%q) returned neither a config nor an error", src)
		}
		return
	}
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("Parse(%q) error is %T (%v), want Problems", src, err, err)
	}
	if c != nil || len(ps) == 0 {
		t.Fatalf("Parse(%q) returned config %v with %d problems", src, c != nil, len(ps))
	}
	lines := bytes.Count(src, []byte("\n")) + 1
	for _, p := range ps {
		if p.File != name || p.Line < 0 || p.Line > lines+1 || p.Message == "" || strings.ContainsAny(p.String(), "\n\r") {
			t.Fatalf("Parse(%q): problem %+v: want one line of file %s at a line of its %d", src, p, name, lines)
		}
		if strings.Contains(p.String(), fuzzSecret) {
			t.Fatalf("Parse(%q): problem %q prints the secret", src, p)
		}
	}
	if !slices.IsSortedFunc(ps, func(a, b Problem) int { return a.Line - b.Line }) {
		t.Fatalf("Parse(%q): problems not sorted by line: %v", src, ps)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(minimal))
	for _, s := range []string{
		minimal + "policies:\n  default:\n    delay: {quantile: 1.2}\n    duplicate_rate: {window: 30s, replacement_reserve: 2}\n",
		minimal + "nats:\n  urls: [nats://u:" + fuzzSecret + "@127.0.0.1:4222]\n  user: u\n  password_env: '" + fuzzSecret + "'\n",
		minimal + "redis:\n  url: redis://:" + fuzzSecret + "@127.0.0.1:6379/0\n  password_env: HEDGEROW_REDIS_PASSWORD\n  hash_key_env: " + fuzzSecret + "\n",
		strings.Replace(minimal, "    model: m\n", "    model: m\n    api_key_env: sk-"+fuzzSecret+"\n", 1),
		minimal + "base: &b {routes: [a]}\nextra:\n  <<: *b\n",
		minimal + "tenants:\n  t:\n    api_key_hashes: [x]\n",
		"routes: {}\n",
		"\t:",
	} {
		f.Add([]byte(s))
	}
	for _, name := range []string{"local.yaml", "openai.yaml", "anthropic.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "examples", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(checkParse)
}
