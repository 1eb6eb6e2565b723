package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// MaxEventBytes bounds one line of a provider's event stream. Chat chunks
// are a few hundred bytes; a longer line means a broken or hostile stream.
const MaxEventBytes = 1 << 20

// eventReader splits a Server-Sent Events body into events, following the
// WHATWG event-stream format: lines end in CRLF, LF or CR; lines starting
// with ':' are comments; "data" fields accumulate; a blank line dispatches.
type eventReader struct {
	lines *bufio.Scanner
	buf   *[]byte // the scanner's first buffer, from linePool
	typ   []byte  // the event's type, reused from one event to the next
	data  []byte  // its data, reused likewise
}

// linePool holds the scanners' first buffers, so that a call does not
// allocate one; a scanner that needs more grows a buffer of its own.
var linePool = sync.Pool{New: func() any {
	b := make([]byte, 4096)
	return &b
}}

func newEventReader(r io.Reader) *eventReader {
	buf := linePool.Get().(*[]byte)
	sc := bufio.NewScanner(r)
	sc.Buffer((*buf)[:0], MaxEventBytes)
	sc.Split(splitLines)
	return &eventReader{lines: sc, buf: buf}
}

// release returns the reader's buffer for another call; the reader, and
// what nextBytes returned, must not be used after it.
func (r *eventReader) release() {
	if r.buf != nil {
		linePool.Put(r.buf)
		r.buf = nil
	}
}

// nextBytes returns the next event with data: its type ("" unless an
// "event:" field set one) and its data lines joined by newlines. At the end
// of the body it returns io.EOF; an event not ended by a blank line is
// discarded, as the format requires, so a stream cut inside an event never
// yields half a chunk. typ and data stay valid until the next call only.
func (r *eventReader) nextBytes() (typ, data []byte, err error) {
	r.typ, r.data = r.typ[:0], r.data[:0]
	hasData := false
	for r.lines.Scan() {
		line := r.lines.Bytes()
		if len(line) == 0 {
			if hasData {
				return r.typ, bytes.TrimSuffix(r.data, []byte("\n")), nil
			}
			r.typ = r.typ[:0]
			continue
		}
		if line[0] == ':' {
			continue // comment: a keep-alive such as ": ping"
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			r.data = append(r.data, value...)
			r.data = append(r.data, '\n')
			hasData = true
		case "event":
			r.typ = append(r.typ[:0], value...)
		}
		// "id" and "retry" serve reconnection, which one attempt never does.
	}
	if err := r.lines.Err(); err != nil {
		return nil, nil, err
	}
	return nil, nil, io.EOF
}

// splitLines is a bufio.SplitFunc for CRLF, LF and lone CR line endings.
func splitLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	// The first CR or LF: IndexByte twice beats IndexAny once.
	i := bytes.IndexByte(data, '\n')
	cr := data
	if i >= 0 {
		cr = data[:i]
	}
	if j := bytes.IndexByte(cr, '\r'); j >= 0 {
		i = j
	}
	switch {
	case i < 0:
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	case data[i] == '\n':
		return i + 1, data[:i], nil
	case i+1 < len(data):
		if data[i+1] == '\n' {
			return i + 2, data[:i], nil
		}
		return i + 1, data[:i], nil
	case atEOF:
		return i + 1, data[:i], nil
	}
	return 0, nil, nil // a CR at the end of the buffer: wait to see if LF follows
}

// eventStream is what a dialect makes of a provider's event stream: it
// folds each event, knows when the final one arrived and what the stream
// came to.
type eventStream interface {
	// event folds one event; it returns the error object of an event that
	// reports a failure, or an error if the event cannot be read.
	event(typ, data []byte) (errObj json.RawMessage, err error)
	// ended reports that the stream's final event arrived.
	ended() bool
	// progress counts the output generated so far: 0 until the first
	// token, then growing with every token (content, tool call, reasoning),
	// never with pings or empty deltas.
	progress() int64
	outcome() Outcome
}

// readEvents hands every event of a provider stream to s until its final
// event and judges how the stream ended: a stream that stops before its
// final event without saying why (what: the finish it lacks) is a transient
// failure, and so is one that produced no token for ps.stallAfter after its
// first (a per-token idle timer cuts the request; docs/architecture.md §4
// rule 4). Whatever the end, the outcome carries the longest gap between
// tokens seen (Outcome.MaxTokenGap).
func readEvents(ctx context.Context, ps *providerStream, s eventStream, now func() time.Time, what string) (out Outcome, err error) {
	events := newEventReader(ps.resp.Body)
	defer events.release()
	stall := stallWatch{bound: ps.stallAfter, cut: ps.cancel}
	defer stall.stop()
	defer func() { out.MaxTokenGap = stall.maxGap }()
	for !s.ended() {
		typ, data, err := events.nextBytes()
		if err != nil && stall.fired.Load() {
			return s.outcome(), stalled(ps.stallAfter)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, bufio.ErrTooLong) {
				return s.outcome(), malformed(fmt.Errorf("event line longer than %d bytes: %w", MaxEventBytes, err))
			}
			return s.outcome(), transportError(ctx, err)
		}
		errObj, err := s.event(typ, data)
		if err != nil {
			return s.outcome(), malformed(err)
		}
		if errObj != nil {
			return s.outcome(), streamError(errObj, now())
		}
		stall.observe(s.progress())
	}
	stall.stop()
	if s.ended() {
		ps.drainAfterEnd()
	}
	out = s.outcome()
	if out.FinishReason == "" {
		return out, &Error{Status: schemas.StatusServerError, Scope: schemas.ScopeTransient, Message: "stream ended before " + what}
	}
	return out, nil
}

// stallWatch is readEvents' per-token idle timer: armed at the first token,
// re-armed by every later one, it cuts the provider request when bound
// passes without a token. Pings, keep-alives and empty deltas do not re-arm
// it: a stream that only says it is alive is stalled. It also measures the
// longest gap between two token arrivals after the first, bound or not,
// from which the dispatcher derives its cohort's bound.
type stallWatch struct {
	bound  time.Duration // 0: off
	cut    func()
	seen   int64
	last   time.Time     // arrival of the last token (monotonic clock)
	maxGap time.Duration // longest gap between token arrivals; 0 before the second
	timer  *time.Timer
	fired  atomic.Bool
}

// observe re-arms the timer, and measures the gap since the last token,
// when progress grew. Tokens that arrive in one event are one arrival.
func (w *stallWatch) observe(progress int64) {
	if progress <= w.seen {
		return
	}
	at := time.Now()
	if w.seen > 0 {
		// At least 1 ns, so that a zero maxGap means "no gap measured"
		// even on a clock too coarse to tell two arrivals apart.
		w.maxGap = max(w.maxGap, at.Sub(w.last), time.Nanosecond)
	}
	w.seen, w.last = progress, at
	if w.bound <= 0 {
		return
	}
	if w.timer == nil {
		w.timer = time.AfterFunc(w.bound, func() {
			w.fired.Store(true)
			w.cut()
		})
		return
	}
	w.timer.Reset(w.bound)
}

func (w *stallWatch) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
}

// stalled is the failure of a stream that produced no token for bound after
// its first: transient, so a replacement may launch before the commit. It
// is a server error rather than a timeout, which the dispatcher reads as
// the deadline passing (docs/architecture.md §4 rule 3).
func stalled(bound time.Duration) *Error {
	return &Error{Status: schemas.StatusServerError, Scope: schemas.ScopeTransient,
		Message: fmt.Sprintf("provider stalled: no token for %v after the first token", bound)}
}
