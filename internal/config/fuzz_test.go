package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// envSecret is the value of every environment variable the fuzzed files
// name: a secret no problem may print. No seed holds it, so a file the
// fuzzer writes holds it nowhere else.
const envSecret = "env-value-canary-7f3a"

// fuzzSecret is the password of the seeds' URLs.
const fuzzSecret = "s3cr3t-canary"

// secretPlaces find the secrets a file may hold: a URL's password, and an
// API key pasted where the name of its environment variable belongs.
var secretPlaces = []*regexp.Regexp{
	regexp.MustCompile(`://[^/@\s:]*:([^/@\s]+)@`),
	regexp.MustCompile(`_env:\s*['"]?(sk-[^\s'"]+)`),
}

// secrets are the texts of src no problem may print: the environment's
// value, and each text found in a secret's place (secretPlaces) and nowhere
// else in src. A text that is also elsewhere in the file — the fuzzer moves
// the seeds' secrets into names and keys — may be printed as that; one
// shorter than minSecretLen is too likely to be in a message by chance (a
// password "1" beside "fuzz.yaml:1").
func secrets(src []byte) []string {
	const minSecretLen = 8
	inPlace := map[string]int{}
	for _, re := range secretPlaces {
		for _, m := range re.FindAllSubmatch(src, -1) {
			inPlace[string(m[1])]++
		}
	}
	out := []string{envSecret}
	for text, n := range inPlace {
		if len(text) >= minSecretLen && bytes.Count(src, []byte(text)) == n {
			out = append(out, text)
		}
	}
	return out
}

// checkParse fails t unless Parse either accepts src or refuses it with
// Problems (never another error, never a config with them), each problem one
// line, placed in the file at a line it has, sorted by line, and none
// printing a secret (secrets).
func checkParse(t *testing.T, src []byte) {
	t.Helper()
	const name = "fuzz.yaml"
	env := func(string) (string, bool) { return envSecret, true }
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
	secret := secrets(src)
	for _, p := range ps {
		if p.File != name || p.Line < 0 || p.Line > lines+1 || p.Message == "" || strings.ContainsAny(p.String(), "\n\r") {
			t.Fatalf("Parse(%q): problem %+v: want one line of file %s at a line of its %d", src, p, name, lines)
		}
		for _, s := range secret {
			if strings.Contains(p.String(), s) {
				t.Fatalf("Parse(%q): problem %q prints the secret %q", src, p, s)
			}
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
		minimal + "nats:\n  urls: [nats://u:" + fuzzSecret + "@127.0.0.1:4222]\n  user: u\n  password_env: HEDGEROW_NATS_PASSWORD\n",
		minimal + "redis:\n  url: redis://:" + fuzzSecret + "@127.0.0.1:6379/0\n  password_env: HEDGEROW_REDIS_PASSWORD\n  hash_key_env: HEDGEROW_HASH_KEY\n",
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

func TestAFuzzedFilesSecretsAreTheEnvironmentsValueAndPasswordsFoundOnlyAsPasswords(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []string
	}{
		{"no URL: the environment's value only", "routes: {}\n", []string{envSecret}},
		{"a URL's password", "urls: [nats://u:password1@h:1]\n", []string{envSecret, "password1"}},
		{"the same password in two URLs", "a: nats://u:password1@h:1\nb: redis://:password1@h:2\n", []string{envSecret, "password1"}},
		{"a password that is also a route's name is that name too", "a: nats://u:password1@h:1\nroutes: [{name: password1}]\n", []string{envSecret}},
		{"each password judged alone", "a: nats://u:password1@h:1\nb: nats://u:password2@h:1\nc: password2\n", []string{envSecret, "password1"}},
		{"a password too short to tell from a line number", "a: nats://u:1@h:1\n", []string{envSecret}},
		{"a key pasted for a variable's name", "api_key_env: 'sk-abcdefgh'\n", []string{envSecret, "sk-abcdefgh"}},
		{"a variable's name", "api_key_env: OPENAI_API_KEY\n", []string{envSecret}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := secrets([]byte(tc.src))
			slices.Sort(got)
			slices.Sort(tc.want)
			if !slices.Equal(got, tc.want) {
				t.Errorf("secrets(%q) = %q, want %q", tc.src, got, tc.want)
			}
		})
	}
}
