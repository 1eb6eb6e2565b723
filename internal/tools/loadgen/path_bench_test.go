package loadgen

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/schemas"
)

// BenchmarkGatewayPath sends one non-streaming 20-token request at a time
// (closed loop, no queueing) straight to an instant fake route, then through
// the whole gateway path to it — HTTP front door or NATS front door →
// dispatcher → NATS → worker → route — so the difference of the ns/op is
// what the path adds to an unloaded request. Run it with -cpuprofile to see
// where that time goes:
//
//	go test -run '^$' -bench GatewayPath -cpuprofile cpu.out ./internal/tools/loadgen/
//	go tool pprof -top cpu.out
func BenchmarkGatewayPath(b *testing.B) {
	s, route, users := startServe(b)
	hc := NewClient(8)
	defer hc.CloseIdleConnections()
	body := []byte(`{"model":"general","messages":[{"role":"user","content":"Say hello"}],"max_tokens":20}`)
	post := func(b *testing.B, url string) {
		resp, err := hc.Post(url+DefaultPath, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			post(b, route)
		}
	})
	b.Run("gateway-http", func(b *testing.B) {
		for b.Loop() {
			post(b, "http://"+s.HTTPAddr().String())
		}
	})
	b.Run("gateway-nats", func(b *testing.B) {
		nc, err := users.Connect(s.NATSURL(), natsauth.UserClient)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		c, err := client.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		req := client.Request{ModelClass: "general", Request: schemas.ChatRequest{
			Messages: []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("Say hello")}}, MaxTokens: 20}}
		for b.Loop() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := c.Submit(ctx, req)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}
