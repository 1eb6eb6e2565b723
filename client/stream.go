package client

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hedgerow/hedgerow/schemas"
)

// Stream is the committed answer of a streaming request, read chunk by
// chunk:
//
//	s, err := c.Stream(ctx, req)
//	if err != nil { ... }
//	defer s.Close()
//	for s.Next() {
//		fmt.Print(s.Chunk().Delta)
//	}
//	if err := s.Err(); err != nil { ... } // an *Error, or ctx's error
//	resp := s.Response()                  // how the answer was won
//
// Chunks carry only the committed winner's output, in order; a failure after
// some chunks (the winner broke off) ends the stream with an *Error, never
// with another attempt's bytes. Next is not safe for concurrent use; Close
// may be called from any goroutine, e.g. to abandon the stream while Next
// waits.
type Stream struct {
	c    *Client
	ctx  context.Context
	stop context.CancelFunc
	sub  *nats.Subscription
	id   string
	seq  int64
	cur  Chunk

	mu     sync.Mutex
	ended  bool // the final message arrived, or the stream failed
	closed bool
	resp   *Response
	err    error
}

// Next waits for the next chunk and reports whether there is one; false
// means the stream ended, successfully (Response) or not (Err).
func (s *Stream) Next() bool {
	s.mu.Lock()
	if s.ended || s.closed {
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()
	m, err := s.sub.NextMsgWithContext(s.ctx)
	if err != nil {
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			s.end(nil, noGateway(s.c.wire, err), false)
		case s.ctx.Err() != nil:
			s.end(nil, fmt.Errorf("hedgerow stream: %w", s.ctx.Err()), true)
		default:
			s.end(nil, fmt.Errorf("hedgerow stream: %w", err), true)
		}
		return false
	}
	switch m.Header.Get(schemas.HeaderStatus) {
	case schemas.StatusChunk:
		var ch Chunk
		if err := schemas.Decode(m.Data, &ch); err != nil {
			s.end(nil, fmt.Errorf("%w: undecodable chunk: %w", ErrStreamBroken, err), true)
			return false
		}
		if ch.Seq != s.seq+1 {
			s.end(nil, fmt.Errorf("%w: chunk %d arrived after chunk %d", ErrStreamBroken, ch.Seq, s.seq), true)
			return false
		}
		s.seq, s.cur = ch.Seq, ch
		return true
	case schemas.StatusDone:
		var resp Response
		if err := schemas.Decode(m.Data, &resp); err != nil {
			s.end(nil, fmt.Errorf("hedgerow stream: read the answer: %w", err), false)
			return false
		}
		s.end(&resp, nil, false)
		return false
	case schemas.StatusError:
		s.end(nil, errorFrom(m), false)
		return false
	}
	if m.Header.Get(micro.ErrorCodeHeader) != "" {
		s.end(nil, errorFrom(m), false)
		return false
	}
	s.end(nil, fmt.Errorf("%w: unexpected message (header %s %q)", ErrStreamBroken, schemas.HeaderStatus, m.Header.Get(schemas.HeaderStatus)), true)
	return false
}

// end records how the stream ended, cancels the request if it may still
// run, and releases the subscription.
func (s *Stream) end(resp *Response, err error, cancelRequest bool) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended, s.resp, s.err = true, resp, err
	s.mu.Unlock()
	if cancelRequest {
		s.c.cancel(s.id)
	}
	_ = s.sub.Unsubscribe()
	s.stop()
}

// Chunk is the chunk the last successful Next read.
func (s *Stream) Chunk() Chunk { return s.cur }

// Err is why the stream ended without an answer: an *Error the gateway
// sent, the context's error, or ErrStreamBroken. It is nil while the
// stream runs and after a success.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Response is the final answer once Next has returned false after a
// success (its Content is empty: the chunks carried it); nil otherwise.
func (s *Stream) Response() *Response {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resp
}

// Close abandons the stream: if its answer has not ended, the request is
// cancelled, which cancels its hedge group. Close is idempotent.
func (s *Stream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	ended := s.ended
	if !ended {
		s.ended, s.err = true, fmt.Errorf("hedgerow stream: %w", context.Canceled)
	}
	s.mu.Unlock()
	if ended {
		return nil
	}
	s.c.cancel(s.id)
	s.stop() // wakes a Next that is waiting
	if err := s.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrBadSubscription) && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("hedgerow stream: unsubscribe: %w", err)
	}
	return nil
}
