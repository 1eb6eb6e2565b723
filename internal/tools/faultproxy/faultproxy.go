// Package faultproxy is a TCP proxy that can partition its clients from
// their upstream on demand and delay what it forwards: the fault suite of
// `make chaos` routes one gateway's Redis through it, and `make regions`
// the gateway links between its regions (docs/architecture.md §12, "The
// local cluster and the fault suite", and §14).
//
// A partition behaves like a network that drops packets rather than one
// that refuses them: bytes already read are held, nothing more is
// forwarded either way, and new connections are accepted but never
// connected to the upstream, so a client sees timeouts, not resets. Healing
// resumes the held connections where they stopped; connections accepted
// during the partition are then connected.
//
// A delay holds each read for that long before it is written on, in each
// direction (a link's one-way latency, not a cap on its throughput).
package faultproxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Proxy forwards connections from its listener to Upstream.
type Proxy struct {
	upstream string
	ln       net.Listener

	mu          sync.Mutex
	partitioned bool
	healed      chan struct{} // closed when the partition ends
	delay       time.Duration
	conns       map[net.Conn]struct{}
	closed      bool
	wg          sync.WaitGroup
}

// Listen starts a proxy on addr forwarding to upstream.
func Listen(addr, upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{upstream: upstream, ln: ln, healed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.healed)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// Partition stops forwarding until Heal.
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.partitioned {
		p.partitioned = true
		p.healed = make(chan struct{})
	}
}

// Heal resumes forwarding.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.partitioned {
		p.partitioned = false
		close(p.healed)
	}
}

// SetDelay holds what is read from then on for d before it is forwarded,
// each way.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = max(d, 0)
}

// Delay is the one-way delay.
func (p *Proxy) Delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// Partitioned reports whether the proxy holds its traffic.
func (p *Proxy) Partitioned() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.partitioned
}

// pass waits while the proxy is partitioned; false once it is closed.
func (p *Proxy) pass() bool {
	p.mu.Lock()
	ch, closed := p.healed, p.closed
	p.mu.Unlock()
	if closed {
		return false
	}
	<-ch
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed
}

// Close stops the listener and every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	if p.partitioned {
		p.partitioned = false
		close(p.healed)
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	if !p.pass() {
		return
	}
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	// Both directions are the proxy's goroutines: Close waits for them,
	// and each one's reader is added while this one is still counted.
	p.wg.Add(2)
	go func() { defer p.wg.Done(); p.copy(up, client); done <- struct{}{} }()
	go func() { defer p.wg.Done(); p.copy(client, up); done <- struct{}{} }()
	<-done // either side closing ends both
}

// chunk is one read, due to be written at due.
type chunk struct {
	data []byte
	due  time.Time
}

// copy forwards src to dst, each read no sooner than the delay after it
// was read, and held while partitioned. A reader goroutine keeps reading
// while earlier reads wait out their delay, so the delay adds latency
// without slowing the stream.
func (p *Proxy) copy(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	chunks := make(chan chunk, 256)
	stop := make(chan struct{})
	defer close(stop)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(chunks)
		buf := make([]byte, 32<<10)
		// No reading while partitioned, so the sender feels the held link
		// as it would a dead network: its writes stall once the buffers
		// fill.
		for p.pass() {
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case chunks <- chunk{data: bytes.Clone(buf[:n]), due: time.Now().Add(p.Delay())}:
				case <-stop:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		if wait := time.Until(c.due); wait > 0 {
			time.Sleep(wait) // the link's latency itself
		}
		if !p.pass() {
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			return
		}
	}
}

// Handler is the proxy's control API: POST /partition, POST /heal,
// POST /delay?d=80ms, GET /state ("partitioned" or "healed"), GET /delay,
// GET /healthz.
func (p *Proxy) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /delay", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("d"))
		if err != nil || d < 0 {
			http.Error(w, "want ?d=<a duration of 0 or more>", http.StatusBadRequest)
			return
		}
		p.SetDelay(d)
		_, _ = fmt.Fprintln(w, p.Delay())
	})
	mux.HandleFunc("GET /delay", func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprintln(w, p.Delay()) })
	mux.HandleFunc("POST /partition", func(w http.ResponseWriter, _ *http.Request) { p.Partition(); state(w, p) })
	mux.HandleFunc("POST /heal", func(w http.ResponseWriter, _ *http.Request) { p.Heal(); state(w, p) })
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, _ *http.Request) { state(w, p) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return mux
}

func state(w http.ResponseWriter, p *Proxy) {
	s := "healed\n"
	if p.Partitioned() {
		s = "partitioned\n"
	}
	_, _ = io.WriteString(w, s)
}

// Control asks the proxy whose control API is at base (http://host:port)
// to partition (true) or heal (false).
func Control(ctx context.Context, base string, partition bool) error {
	path := "/heal"
	if partition {
		path = "/partition"
	}
	return post(ctx, base, path)
}

// ControlDelay sets the delay of the proxy whose control API is at base.
func ControlDelay(ctx context.Context, base string, d time.Duration) error {
	return post(ctx, base, "/delay?d="+url.QueryEscape(d.String()))
}

func post(ctx context.Context, base, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, nil)
	if err != nil {
		return fmt.Errorf("faultproxy: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("faultproxy: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("faultproxy: %s: %s", path, resp.Status)
	}
	return nil
}

// State is the state of the proxy whose control API is at base: e.g.
// "healed, delay 80ms".
func State(ctx context.Context, base string) (string, error) {
	var parts []string
	for _, path := range []string{"/state", "/delay"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return "", fmt.Errorf("faultproxy: %w", err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", fmt.Errorf("faultproxy: %w", err)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 256))
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("faultproxy: %s: %s %v", path, resp.Status, err)
		}
		parts = append(parts, strings.TrimSpace(string(body)))
	}
	return parts[0] + ", delay " + parts[1], nil
}
