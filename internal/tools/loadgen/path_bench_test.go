package loadgen

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"syscall"
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

// BenchmarkGatewayPathCPU sends the same request from 16 goroutines at
// once — a whole answer, then a stream, of 20 tokens — straight to the fake
// and through the HTTP door, and reports the
// process's CPU time per request (cpu-µs/op: user and system, everything
// in the process — client, gateway, workers, embedded NATS, records and
// the fake). The difference of the two is the CPU the path costs a
// request under concurrency, a steadier figure on a shared machine than
// latency; compare it before and after a change in one run:
//
//	go test -run '^$' -bench GatewayPathCPU -count 5 ./internal/tools/loadgen/
func BenchmarkGatewayPathCPU(b *testing.B) {
	s, route, _ := startServe(b)
	hc := NewClient(32)
	defer hc.CloseIdleConnections()
	whole := []byte(`{"model":"general","messages":[{"role":"user","content":"Say hello"}],"max_tokens":20}`)
	stream := []byte(`{"model":"general","messages":[{"role":"user","content":"Say hello"}],"max_tokens":20,"stream":true}`)
	gateway := "http://" + s.HTTPAddr().String()
	for _, target := range []struct {
		name, url string
		body      []byte
	}{
		{"direct", route, whole},
		{"gateway-http", gateway, whole},
		{"direct-stream", route, stream},
		{"gateway-http-stream", gateway, stream},
	} {
		b.Run(target.name, func(b *testing.B) {
			b.SetParallelism(8)
			before := processCPU(b)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := hc.Post(target.url+DefaultPath, "application/json", bytes.NewReader(target.body))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64((processCPU(b)-before).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// processCPU is the user and system time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
