package main

import (
	"strings"
	"testing"
)

// No role prints a password given in a URL when it fails to start or to
// reach its servers: the text a user sees (stdout, stderr and the error
// main prints) holds the URL with its password masked, or the refusal of
// credentials in a NATS URL (docs/architecture.md §9, §10).
func TestFailedStartsNeverPrintAPasswordFromAURL(t *testing.T) {
	const secret = "zqnatspassword"
	refused := "nats://alice:" + secret + "@127.0.0.1:1"
	unparsable := "nats://alice:" + secret + "@127.0.0.1:bad"
	natsConfig := writeConfig(t, "nats: {urls: [\""+refused+"\"]}\n", "http://127.0.0.1:1/v1")
	plainConfig := writeConfig(t, "nats: {urls: [\"nats://127.0.0.1:1\"]}\n", "http://127.0.0.1:1/v1")
	badConfig := writeConfig(t, "nats: {urls: [\""+unparsable+"\"]}\nredis: {url: \"redis://:"+secret+"@127.0.0.1:bad\"}\n",
		"http://bob:"+secret+"@127.0.0.1:1/v1")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"gateway, no server answers", []string{"gateway", "--config", natsConfig, "--start-timeout", "600ms"}},
		{"gateway, --nats does not parse", []string{"gateway", "--config", natsConfig, "--nats", unparsable}},
		{"worker, no server answers", []string{"worker", "--config", natsConfig, "--start-timeout", "600ms"}},
		{"gateway, --nats with a password that no server answers, each retry logged", []string{"gateway", "--config", plainConfig, "--nats", refused, "--start-timeout", "600ms"}},
		{"worker, --nats with a password that no server answers, each retry logged", []string{"worker", "--config", plainConfig, "--nats", refused, "--start-timeout", "600ms"}},
		{"worker, --nats does not parse", []string{"worker", "--config", natsConfig, "--nats", unparsable}},
		{"serve, a bad configuration", []string{"serve", "--config", badConfig}},
		{"config check", []string{"config", "check", "--role", "gateway", badConfig}},
		{"bench over NATS", []string{"bench", "--nats", refused, "--duration", "100ms"}},
		{"bench over HTTP, a URL that does not parse", []string{"bench", "--url", "http://alice:" + secret + "@127.0.0.1:bad", "--duration", "100ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runRoot(t, tc.args...)
			if err == nil {
				t.Fatalf("%v succeeded:\n%s", tc.args, out)
			}
			if text := out + "\n" + err.Error(); strings.Contains(text, secret) {
				t.Errorf("the password is printed:\n%s", text)
			} else if !strings.Contains(text, "xxxxx@") && !strings.Contains(text, "must not hold credentials") {
				// Either the URL is named masked, or the configuration refused
				// credentials in it (NATS credentials have keys of their own).
				t.Errorf("the error neither names the masked URL nor refuses its credentials:\n%s", text)
			}
		})
	}
}
