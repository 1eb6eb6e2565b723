package node

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/internal/natstest"
)

func TestAGatewayWithoutJetStreamLogsOnceThatRecordsAreNotKeptAndServes(t *testing.T) {
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1), "")
	srv := natstest.Start(t, natstest.MaxPayload(16<<20)) // no JetStream
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w, err := StartWorkers(cfg, natstest.Connect(t, srv, nats.Name("worker")), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, w)
	g, err := StartGateway(cfg, natstest.Connect(t, srv, nats.Name("gateway")), nil, Options{Logger: log})
	if err != nil {
		t.Fatalf("a gateway against NATS without JetStream must start: %v", err)
	}
	defer stop(t, g)
	for range 3 {
		if code, body := postChat(t, "http://"+g.Addr().String()); code != http.StatusOK {
			t.Fatalf("chat without JetStream: %d %s", code, body)
		}
	}
	if n := strings.Count(logs.String(), "records are not kept"); n != 1 {
		t.Fatalf("the gateway said %d times that records are not kept, want once:\n%s", n, logs.String())
	}
}
