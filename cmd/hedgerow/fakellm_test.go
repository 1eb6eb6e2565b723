package main

import (
	"net/http"
	"strings"
	"testing"
)

func TestFakeLLMServesModelsUntilStopped(t *testing.T) {
	noLeaks(t)
	r := startCmd(t, "fakellm", "--listen", "127.0.0.1:0", "--workload", "sonnet", "--seed", "3",
		"--time-scale", "0.01", "--route", "2")
	base := r.waitFor(servingURL)
	status, body := getBody(t, base+"/v1/models")
	if status != http.StatusOK || !strings.Contains(body, `"sonnet"`) {
		t.Fatalf("/v1/models: %d %s", status, body)
	}
	status, body = getBody(t, base+"/stats?limit=0")
	if status != http.StatusOK || !strings.Contains(body, `"route":2`) || !strings.Contains(body, `"seed":3`) {
		t.Fatalf("/stats does not show the flags: %d %s", status, body)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("fakellm: %v", err)
	}
}

func TestFakeLLMRefusesAnUnknownWorkload(t *testing.T) {
	out, err := runRoot(t, "fakellm", "--listen", "127.0.0.1:0", "--workload", "nope")
	if err == nil {
		t.Fatalf("fakellm with an unknown workload started:\n%s", out)
	}
}
