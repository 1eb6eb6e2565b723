package node

import (
	"errors"
	"net"
	"testing"
)

func TestLimitListenerHoldsAtMostItsConnectionsOpen(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := limitListener(inner, 1)
	defer ln.Close()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	first, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	dial()
	select {
	case c := <-accepted:
		t.Fatalf("a second connection %v was accepted while the only slot was held", c)
	default:
	}
	if len(ln.(*limitedListener).slots) != 1 {
		t.Fatalf("%d slots taken, want 1", len(ln.(*limitedListener).slots))
	}
	first.Close()
	first.Close() // a second Close frees nothing more
	second, ok := <-accepted
	if !ok {
		t.Fatal("Accept failed after the slot was freed")
	}
	second.Close()
}

func TestLimitListenerCloseWakesAnAcceptWaitingForASlot(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := limitListener(inner, 1)
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	held, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	done := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		done <- err
	}()
	ln.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close = %v, want net.ErrClosed", err)
	}
}
