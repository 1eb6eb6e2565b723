package main

import (
	"fmt"
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

func TestFakeLLMAnswers429PastItsRequestsPerMinute(t *testing.T) {
	noLeaks(t)
	// Two requests a real minute: the bucket starts full and refills one
	// every 30 s, so the third request at once is refused.
	r := startCmd(t, "fakellm", "--listen", "127.0.0.1:0", "--instant", "1", "--requests-per-minute", "2")
	base := r.waitFor(servingURL)
	var statuses []int
	for i := range 3 {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"sonnet","max_tokens":1,"messages":[{"role":"user","content":"q%d"}]}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Errorf("429 without Retry-After")
		}
		resp.Body.Close()
	}
	if statuses[2] != http.StatusTooManyRequests || statuses[0] == http.StatusTooManyRequests || statuses[1] == http.StatusTooManyRequests {
		t.Errorf("statuses %v: want the first two admitted and the third 429", statuses)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("fakellm: %v", err)
	}
}

func TestFakeLLMRefusesALimitItsTimeScaleCannotKeepWhole(t *testing.T) {
	out, err := runRoot(t, "fakellm", "--listen", "127.0.0.1:0", "--time-scale", "0.1", "--requests-per-minute", "5")
	if err == nil || !strings.Contains(err.Error(), "whole number") {
		t.Fatalf("fakellm with 0.5 requests a model minute: err %v\n%s", err, out)
	}
}
