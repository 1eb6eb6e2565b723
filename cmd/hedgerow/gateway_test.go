package main

import (
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/internal/natstest"
)

func TestGatewayRefusesANATSClusterWithASmallerMaxPayload(t *testing.T) {
	ns := natstest.Start(t, natstest.MaxPayload(1<<20))
	path := writeConfig(t, "nats: {urls: [\"nats://127.0.0.1:1\"]}\n", "http://127.0.0.1:1/v1")
	out, err := runRoot(t, "gateway", "--config", path, "--nats", ns.ClientURL())
	if err == nil || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("gateway against a 1MiB cluster: %v\n%s", err, out)
	}
}
