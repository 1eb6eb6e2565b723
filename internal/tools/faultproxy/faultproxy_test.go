package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo is an upstream that sends every line back.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(c net.Conn, line string, wait time.Duration) (string, error) {
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	got, err := bufio.NewReader(c).ReadString('\n')
	_ = c.SetReadDeadline(time.Time{})
	return got, err
}

func TestAPartitionHoldsTrafficBothWaysAndHealingDeliversIt(t *testing.T) {
	p, err := Listen("127.0.0.1:0", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "before", 10*time.Second); err != nil || got != "before\n" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}

	p.Partition()
	// Nothing comes back while partitioned: the read times out, it is not
	// refused or reset.
	if got, err := roundTrip(c, "during", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("partitioned: read %q, %v; want a timeout", got, err)
	}
	late, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatalf("a new connection during the partition is refused: %v", err)
	}
	defer late.Close()
	if got, err := roundTrip(late, "new", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection made during the partition: read %q, %v; want a timeout", got, err)
	}

	p.Heal()
	r := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "during\n" {
		t.Fatalf("after healing, the held line: %q, %v", got, err)
	}
	lr := bufio.NewReader(late)
	_ = late.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := lr.ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("after healing, the late connection's line: %q, %v", got, err)
	}
}

func TestTheControlAPIPartitionsAndHeals(t *testing.T) {
	p, err := Listen("127.0.0.1:0", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	srv := httptest.NewServer(p.Handler())
	defer srv.Close()
	if err := Control(t.Context(), srv.URL, true); err != nil || !p.Partitioned() {
		t.Fatalf("partition: %v, partitioned %v", err, p.Partitioned())
	}
	if err := Control(t.Context(), srv.URL, false); err != nil || p.Partitioned() {
		t.Fatalf("heal: %v, partitioned %v", err, p.Partitioned())
	}
}

func TestClosingEndsHeldConnections(t *testing.T) {
	p, err := Listen("127.0.0.1:0", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.Partition()
	if _, err := io.WriteString(c, "held\n"); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	// Closed (EOF, or a reset for the bytes it held unread), not left
	// hanging until the deadline.
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Close: %v; want the connection closed", err)
	}
}

// A delay holds each read that long each way: a round trip through the
// proxy takes at least twice the delay (a lower bound, which no load can
// break), and the control API sets and reads it.
func TestADelayHoldsEachWayAndIsSetThroughTheControlAPI(t *testing.T) {
	p, err := Listen("127.0.0.1:0", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctl := httptest.NewServer(p.Handler())
	defer ctl.Close()
	const delay = 40 * time.Millisecond
	if err := ControlDelay(t.Context(), ctl.URL, delay); err != nil {
		t.Fatal(err)
	}
	if got := p.Delay(); got != delay {
		t.Fatalf("delay %v after the control API set %v", got, delay)
	}
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, line := range []string{"one", "two"} {
		start := time.Now()
		got, err := roundTrip(c, line, 10*time.Second)
		if err != nil || got != line+"\n" {
			t.Fatalf("round trip of %q: %q, %v", line, got, err)
		}
		if took := time.Since(start); took < 2*delay {
			t.Fatalf("a round trip took %v, under twice the delay of %v", took, delay)
		}
	}
	if err := post(t.Context(), ctl.URL, "/delay?d=-1s"); err == nil {
		t.Error("a negative delay was taken")
	}
}
