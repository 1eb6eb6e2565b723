package main

import (
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hedgerow/hedgerow/internal/natstest"
)

var (
	waitingForNATS  = regexp.MustCompile(`(nats does not answer yet; retrying)`)
	answeringProbes = regexp.MustCompile(`probes=(http://\S+)`)
)

// TestAGatewayStartedBeforeItsNATSServerWaitsAndBecomesReady: a gateway
// whose NATS server does not exist yet logs its retries and keeps
// waiting, its listener answering /healthz 200 and /readyz and requests
// 503; once a server starts on the configured port it connects,
// serves and answers /readyz 200; stopped, it exits cleanly.
func TestAGatewayStartedBeforeItsNATSServerWaitsAndBecomesReady(t *testing.T) {
	noLeaks(t)
	addr := natstest.FreeAddr(t)
	path := writeConfig(t, "nats: {urls: [\"nats://"+addr+"\"]}\n", "http://127.0.0.1:1/v1")
	r := startCmd(t, "gateway", "--config", path)
	probes := r.waitFor(answeringProbes)
	r.waitFor(waitingForNATS)
	r.waitFor(waitingForNATS) // a second try: it keeps waiting, it did not exit
	if code, body := getBody(t, probes+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while waiting: %d %s, want 200 (alive)", code, body)
	}
	if code, body := getBody(t, probes+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"waiting_for":"nats"`) {
		t.Fatalf("/readyz while waiting: %d %s, want 503 waiting for nats", code, body)
	}
	if code, body := getBody(t, probes+"/v1/chat/completions"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"unavailable"`) {
		t.Fatalf("a request while waiting: %d %s, want 503 unavailable", code, body)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	natstest.Start(t, natstest.MaxPayload(16<<20), func(o *server.Options) { o.Port = p })
	base := r.waitFor(servingURL)
	if code, body := getBody(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz once NATS answered: %d %s", code, body)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("gateway: %v", err)
	}
}

// TestAProcessStoppedWhileWaitingForNATSExitsCleanly: SIGTERM (here its
// context) during the wait ends a gateway or a worker at once, with no
// error and nothing left running.
func TestAProcessStoppedWhileWaitingForNATSExitsCleanly(t *testing.T) {
	for _, role := range []string{"gateway", "worker"} {
		t.Run(role, func(t *testing.T) {
			noLeaks(t)
			path := writeConfig(t, "nats: {urls: [\"nats://"+natstest.FreeAddr(t)+"\"]}\n", "http://127.0.0.1:1/v1")
			r := startCmd(t, role, "--config", path)
			r.waitFor(waitingForNATS)
			if err := r.stop(); err != nil {
				t.Fatalf("%s stopped while waiting: %v, want a clean exit", role, err)
			}
		})
	}
}
