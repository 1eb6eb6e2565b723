package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestEveryFlagsHelpShowsItsTypeNotAPhrase: pflag shows a back-quoted word
// of a flag's usage as its value's name, so `hedgerow nats-auth` in a usage
// once read as the flag's type ("--nats-nkey-seed hedgerow nats-auth").
func TestEveryFlagsHelpShowsItsTypeNotAPhrase(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if name, _ := pflag.UnquoteUsage(f); strings.ContainsAny(name, " \t") {
				t.Errorf("%s --%s shows its value as %q", c.CommandPath(), f.Name, name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
}

// TestFakeLLMsHelpNamesEveryAPIItServes: the help lists every endpoint the
// fake answers, not only chat completions.
func TestFakeLLMsHelpNamesEveryAPIItServes(t *testing.T) {
	out, err := runRoot(t, "fakellm", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings", "/v1/models"} {
		if !strings.Contains(out, path) {
			t.Errorf("fakellm --help does not name %s:\n%s", path, out)
		}
	}
}
