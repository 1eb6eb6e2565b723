package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// attemptRun is one attempt from Accept to AttemptResult. It is the
// upstream.Sink of its call: Stream reports the first token and deltas on
// the run's goroutine while the pacer goroutine sends heartbeats and flushes
// chunks that waited CoalesceDelay; mu orders the two, so the reply inbox
// sees one sequence. Heartbeats go on until the result (docs/architecture.md
// §8), so the dispatcher notices a worker lost mid-answer within its
// heartbeat timeout.
type attemptRun struct {
	w        *Worker
	att      schemas.Attempt
	key      attemptKey
	received time.Time
	stream   bool // the caller wants chunks
	// foldsFirstByte: a stream whose dispatcher takes its first chunk as
	// its first byte (schemas.Attempt.FoldsFirstByte).
	foldsFirstByte bool

	ctx          context.Context
	cancel       context.CancelCauseFunc
	stopDeadline context.CancelFunc

	// Guarded by w.mu: the dispatcher's cancel, if one came.
	cancelAt     time.Time
	cancelReason schemas.CancelReason

	// arm tells the pacer that output is waiting to be flushed.
	arm chan struct{}

	// The pacer goroutine starts only when it has work: the first heartbeat
	// is due (wake fires a heartbeat interval into the call) or output waits
	// for the coalesce delay. A call over within a heartbeat interval never
	// needs it.
	wake      *time.Timer   // starts the pacer when the first heartbeat is due
	wakeDone  chan struct{} // closed when wake's function has returned
	stopPacer chan struct{}
	pacerDone chan struct{}

	mu          sync.Mutex
	pacing      bool // the pacer goroutine was started
	done        bool // the result is being sent: nothing more on the inbox
	firstByteAt time.Time
	// firstByteOwed: the first byte came and no FirstByte was sent for it,
	// as the dispatcher folds it into the first chunk (foldsFirstByte);
	// whatever goes on the inbox next must stand for it.
	firstByteOwed bool
	heartbeats    int64
	lastSent      time.Time // real time of the last progress message (heartbeat, first byte, chunk)
	seq           int64     // last chunk sent
	firstToken    bool      // the chunk with the first token has been sent
	cumTokens     int64
	pend          pendingChunk
	pendingSince  time.Time // real time of the first unflushed output
}

// pendingChunk is output not yet sent as a Chunk.
type pendingChunk struct {
	content   strings.Builder
	toolCalls []json.RawMessage
	tokens    int64
}

func (p *pendingChunk) empty() bool {
	return p.content.Len() == 0 && len(p.toolCalls) == 0 && p.tokens == 0
}

func (p *pendingChunk) add(d upstream.Delta) {
	p.content.WriteString(d.Content)
	p.toolCalls = appendToolCalls(p.toolCalls, d.ToolCalls)
	p.tokens += int64(d.Tokens)
}

func (p *pendingChunk) reset() {
	p.content.Reset()
	p.toolCalls = nil
	p.tokens = 0
}

// appendToolCalls appends the fragments of one chunk's tool-call array, so
// that a coalesced Chunk carries every fragment in order.
func appendToolCalls(dst []json.RawMessage, raw json.RawMessage) []json.RawMessage {
	if !schemas.HasToolCalls(raw) {
		return dst
	}
	var frags []json.RawMessage
	if err := json.Unmarshal(raw, &frags); err != nil {
		// The adapter hands arrays; anything else travels as one fragment.
		return append(dst, raw)
	}
	return append(dst, frags...)
}

func newAttemptRun(w *Worker, att schemas.Attempt, received time.Time) *attemptRun {
	base, cancel := context.WithCancelCause(context.Background())
	// A relative timeout, measured from receipt on this worker's clock: a
	// clock running behind the dispatcher's cannot extend the deadline.
	budget := att.EffectiveDeadline(received).Sub(received)
	ctx, stop := context.WithTimeoutCause(base, budget, errDeadline)
	return &attemptRun{
		w: w, att: att, key: attemptKey{att.GroupID, att.Attempt}, received: received,
		stream: att.Request.Stream,
		ctx:    ctx, cancel: cancel, stopDeadline: stop,
		foldsFirstByte: att.FoldsFirstByte && att.Request.Stream,
		arm:            make(chan struct{}, 1),
	}
}

// run calls the upstream, then reports the result and the record.
func (r *attemptRun) run() {
	defer r.w.runs.Done()
	defer r.stopDeadline()
	defer r.cancel(nil)

	var (
		out      upstream.Outcome
		err      error
		ended    error // why the context had ended when the call returned
		called   bool
		returned time.Time
	)
	if r.ctx.Err() == nil {
		called = true
		r.stopPacer, r.pacerDone = make(chan struct{}), make(chan struct{})
		r.wakeDone = make(chan struct{})
		r.wake = time.AfterFunc(r.w.cfg.HeartbeatInterval, r.wakePacer)
		// The cohort's stall bound after the first token, when the attempt
		// names one (docs/architecture.md §4 rule 4).
		callCtx := upstream.WithStallAfterFirstToken(r.ctx, time.Duration(r.att.StallAfterFirstTokenMs)*time.Millisecond)
		out, err = r.call(callCtx)
		returned = r.w.cfg.Now()
		if r.ctx.Err() != nil {
			ended = context.Cause(r.ctx)
		}
		r.mu.Lock()
		r.flushLocked(false)
		r.done = true
		r.mu.Unlock()
		r.stopPacing()
	} else {
		returned = r.w.cfg.Now()
		ended = context.Cause(r.ctx)
		err = ended
	}
	cancelAt, reason := r.w.finish(r)

	res, ue := r.result(out, err, ended)
	if res.StatusClass == schemas.StatusOK && !r.stream {
		res.Content, res.ToolCalls = out.Content, out.ToolCalls
		res.Embeddings = out.Embeddings
	}
	if res.StatusClass == schemas.StatusOK {
		// A refusal is never streamed as chunks: every caller gets it here.
		res.Refusal = out.Refusal
	}
	// Counted before it is published: whoever sees the result sees it
	// counted.
	m := r.w.metrics
	m.answered(r.w.cfg.Route, res.StatusClass)
	r.publishResult(res)
	r.publishRecord(res, out.Usage, cancelAt, reason)

	if !cancelAt.IsZero() {
		latency := time.Duration(-1)
		if called && !returned.Before(cancelAt) {
			latency = returned.Sub(cancelAt)
		}
		m.cancelled(res.CancellationObserved, latency)
	}
	attrs := []any{"group_id", r.att.GroupID, "attempt", r.att.Attempt, "status", res.StatusClass,
		"scope", res.ErrorScope, "elapsed_ms", res.ElapsedMs}
	if ue != nil {
		attrs = append(attrs, "http_status", ue.HTTPStatus, "error", ue.Message)
	}
	r.w.log.Debug("attempt ended", attrs...)
}

// continuer is an Upstream that can continue an answer from partial
// output: the provider adapters, in their route's continuation style.
type continuer interface {
	Continue(ctx context.Context, req *schemas.ChatRequest, from schemas.Continuation, sink upstream.Sink) (upstream.Outcome, error)
}

// call runs the attempt's upstream call, with the run as its sink: a
// continuation attempt (docs/architecture.md §6, "Continuation attempts")
// continues from its partial answer, so its chunks carry only the text
// that follows it; any other answers the request. An attempt whose role
// and continuation disagree, or a continuation on an Upstream that cannot
// continue, is refused before anything is sent.
func (r *attemptRun) call(ctx context.Context) (upstream.Outcome, error) {
	up, cont := r.w.cfg.Upstream, r.att.Continuation
	if cont == nil && r.att.Role != schemas.RoleContinuation {
		return up.Stream(ctx, &r.att.Request, r)
	}
	if cont == nil || r.att.Role != schemas.RoleContinuation {
		return upstream.Outcome{}, upstream.NotContinuable(fmt.Errorf("%w: %w: an attempt carries a continuation exactly when its role is continuation",
			schemas.ErrNotContinuable, schemas.ErrMalformedRequest))
	}
	c, ok := up.(continuer)
	if !ok {
		return upstream.Outcome{}, upstream.CannotContinue("the route's adapter has no continuation")
	}
	return c.Continue(ctx, &r.att.Request, *cont, r)
}

// result builds the AttemptResult from the call's outcome and error. ended,
// when set, is why the attempt's context had ended as the call returned (or
// before it was made): a cancel, the deadline, the shutdown or a lost reply
// inbox, which explains a failure better than the adapter's view of a
// closed connection can.
func (r *attemptRun) result(out upstream.Outcome, err, ended error) (schemas.AttemptResult, *upstream.Error) {
	res := schemas.AttemptResult{
		GroupID: r.att.GroupID, Attempt: r.att.Attempt, WorkerID: r.w.cfg.WorkerID, Secret: r.att.Secret,
		StatusClass: schemas.StatusOK, ErrorScope: schemas.ScopeNone,
		FinishReason: out.FinishReason,
		LastSeq:      r.seq,
		Usage:        out.Usage,
		ElapsedMs:    max(r.w.cfg.Now().Sub(r.received).Milliseconds(), 0),
	}
	if !r.firstByteAt.IsZero() {
		res.FirstByteMs = schemas.Millis(max(r.firstByteAt.Sub(r.received), 0))
	}
	if out.MaxTokenGap > 0 {
		// Rounded up: a gap was measured, however short, and the
		// dispatcher learns the cohort's stall bound from it
		// (docs/architecture.md §4 rule 4).
		res.MaxTokenGapMs = int64((out.MaxTokenGap + time.Millisecond - 1) / time.Millisecond)
	}
	if !r.firstByteAt.IsZero() || err == nil {
		// Tokens and answers come only in a success status. A stream that
		// failed before its first token keeps the status the error names.
		res.HTTPStatus = 200
	}
	var ue *upstream.Error
	errors.As(err, &ue)
	if ue != nil && ue.HTTPStatus != 0 {
		res.HTTPStatus = ue.HTTPStatus
	}
	switch {
	case err == nil:
		// A complete answer stands even if a cancel or the deadline came as
		// it completed: the dispatcher records a late loser as such.
		return res, nil
	case ended != nil:
		// The call was never made, or it stopped because the context ended.
		res.FinishReason = ""
		switch {
		case errors.Is(ended, errCancelled):
			res.StatusClass, res.ErrorScope, res.CancellationObserved = schemas.StatusCanceled, schemas.ScopeNone, true
		case errors.Is(ended, errDeadline):
			res.StatusClass, res.ErrorScope = schemas.StatusTimeout, schemas.ScopeTransient
		case errors.Is(ended, errReplyLost):
			res.StatusClass, res.ErrorScope = schemas.StatusLost, schemas.ScopeTransient
		default: // errShutdown
			res.StatusClass, res.ErrorScope = schemas.StatusCanceled, schemas.ScopeTransient
		}
		res.ErrorMessage = ended.Error()
		return res, ue
	}
	res.FinishReason = ""
	if ue == nil { // the Upstream contract says this cannot happen
		res.StatusClass, res.ErrorScope = schemas.StatusServerError, schemas.ScopeTransient
		res.ErrorMessage = "upstream returned an unclassified error"
		return res, nil
	}
	res.StatusClass, res.ErrorScope = ue.Status, ue.Scope
	if res.ErrorScope == schemas.ScopeNone && res.StatusClass != schemas.StatusOK {
		res.ErrorScope = schemas.ScopeTransient
	}
	if ue.RetryAfter > 0 {
		res.RetryAfterMs = max(ue.RetryAfter.Milliseconds(), 1)
	}
	res.ErrorMessage = schemas.SanitizeMessage(ue.Message)
	return res, ue
}

func (r *attemptRun) publishResult(res schemas.AttemptResult) {
	err := r.w.publishReply(r.att.ReplyInbox, res)
	if errors.Is(err, nats.ErrMaxPayload) && (res.Content != "" || res.ToolCalls != nil || res.Refusal != "" || res.Embeddings != nil) {
		// The answer does not fit a NATS message: report the failure rather
		// than leave the dispatcher waiting for a result that never comes.
		res.Content, res.ToolCalls, res.Refusal, res.Embeddings = "", nil, "", nil
		res.StatusClass, res.ErrorScope = schemas.StatusServerError, schemas.ScopeTransient
		res.ErrorMessage = "answer exceeds the NATS max payload"
		_ = r.w.publishReply(r.att.ReplyInbox, res)
	}
}

// FirstByte implements upstream.Sink: the provider's first generated token
// (not its headers, docs/architecture.md §4 rule 2) is the attempt's first
// byte, which ends the heartbeats.
func (r *attemptRun) FirstByte() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.firstByteLocked()
}

func (r *attemptRun) firstByteLocked() {
	if !r.firstByteAt.IsZero() {
		return
	}
	r.firstByteAt = r.w.cfg.Now()
	if r.foldsFirstByte {
		// The adapter's next call is the Delta holding the first token,
		// whose chunk goes out at once and stands for the first byte.
		r.firstByteOwed = true
		return
	}
	r.sendFirstByteLocked()
}

// sendFirstByteLocked sends the FirstByte of the first byte that came.
func (r *attemptRun) sendFirstByteLocked() {
	r.firstByteOwed = false
	r.send(schemas.FirstByte{
		GroupID: r.att.GroupID, Attempt: r.att.Attempt, WorkerID: r.w.cfg.WorkerID, Secret: r.att.Secret,
		ElapsedMs: max(r.firstByteAt.Sub(r.received).Milliseconds(), 0),
	})
}

// Delta implements upstream.Sink: the chunk holding the first content or
// tool-call token goes out at once, as it is the default commit point; later
// output waits for CoalesceTokens tokens or CoalesceDelay.
func (r *attemptRun) Delta(d upstream.Delta) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.firstByteLocked() // the adapter reports it first; never send a chunk without it
	r.cumTokens += int64(d.Tokens)
	if !r.stream {
		return
	}
	isToken := d.Content != "" || schemas.HasToolCalls(d.ToolCalls)
	if r.firstByteOwed && (!isToken || r.firstToken) {
		// Output that does not go out at once (reasoning, a refusal):
		// the dispatcher must not wait for it to learn of the first byte.
		r.sendFirstByteLocked()
	}
	wasEmpty := r.pend.empty()
	r.pend.add(d)
	switch {
	case isToken && !r.firstToken:
		r.firstToken = true
		r.flushLocked(true)
	case r.pend.tokens >= int64(r.w.cfg.CoalesceTokens):
		r.flushLocked(false)
	case wasEmpty && !r.pend.empty():
		r.pendingSince = time.Now()
		r.startPacerLocked()
		select {
		case r.arm <- struct{}{}:
		default: // the pacer has a signal to read already
		}
	}
}

// flushLocked sends the pending output as the next Chunk.
func (r *attemptRun) flushLocked(first bool) {
	if r.pend.empty() || r.done {
		return
	}
	r.seq++
	c := schemas.Chunk{
		GroupID: r.att.GroupID, Attempt: r.att.Attempt, Seq: r.seq,
		WorkerID: r.w.cfg.WorkerID, Secret: r.att.Secret,
		Delta:  r.pend.content.String(),
		Tokens: r.pend.tokens, CumulativeTokens: r.cumTokens,
		First: first,
	}
	if len(r.pend.toolCalls) > 0 {
		raw, err := json.Marshal(r.pend.toolCalls)
		if err == nil {
			c.ToolCalls = raw
		}
	}
	r.pend.reset()
	r.firstByteOwed = false // this chunk stands for it
	r.send(c)
}

// send publishes one progress message; if the reply inbox is unreachable,
// the attempt stops, since nobody would see its answer.
func (r *attemptRun) send(m json.Marshaler) {
	r.lastSent = time.Now()
	if err := r.w.publishReply(r.att.ReplyInbox, m); err != nil {
		r.cancel(errReplyLost)
	}
}

// heartbeat sends the next heartbeat; false once the call is over. A
// provider stream that is open but has produced no token yet is beaten
// for, so the dispatcher does not take a slow model for a lost worker; so
// is one after its first token (and a call that is not streamed), so the
// dispatcher does take a worker killed mid-answer for lost
// (docs/architecture.md §4 rule 4, §8). After the first byte, whatever
// was sent within the interval (a chunk) stands for the heartbeat.
func (r *attemptRun) heartbeat() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return false
	}
	if !r.firstByteAt.IsZero() && time.Since(r.lastSent) < r.w.cfg.HeartbeatInterval {
		return true
	}
	r.heartbeats++
	r.send(schemas.Heartbeat{GroupID: r.att.GroupID, Attempt: r.att.Attempt, Seq: r.heartbeats,
		WorkerID: r.w.cfg.WorkerID, Secret: r.att.Secret})
	return true
}

// wakePacer runs when the first heartbeat is due: unless the call is over
// or the pacer already runs, the pacer starts, with that heartbeat.
func (r *attemptRun) wakePacer() {
	defer close(r.wakeDone)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done && !r.pacing {
		r.pacing = true
		go r.pace(r.stopPacer, r.pacerDone, true)
	}
}

// startPacerLocked starts the pacer, if it has not started, for output that
// waits for the coalesce delay; heartbeats follow at the interval.
func (r *attemptRun) startPacerLocked() {
	if r.done || r.pacing || r.stopPacer == nil {
		return
	}
	r.pacing = true
	go r.pace(r.stopPacer, r.pacerDone, false)
}

// stopPacing stops the pacer, or its pending start, once the call is over
// (done is set), and waits for it: nothing is sent on the inbox after it.
func (r *attemptRun) stopPacing() {
	if !r.wake.Stop() {
		<-r.wakeDone // wakePacer has started: let it finish
	}
	r.mu.Lock()
	pacing := r.pacing
	r.mu.Unlock()
	if pacing {
		close(r.stopPacer)
		<-r.pacerDone
	}
}

// pace runs beside the upstream call: heartbeats until the result, and
// the flush of output that has waited CoalesceDelay. beatNow sends the
// first heartbeat at once: the pacer started when it was due.
func (r *attemptRun) pace(stop <-chan struct{}, done chan<- struct{}, beatNow bool) {
	defer close(done)
	hb := time.NewTicker(r.w.cfg.HeartbeatInterval)
	defer hb.Stop()
	beats := hb.C
	if beatNow && !r.heartbeat() {
		hb.Stop()
		beats = nil
	}
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	defer flush.Stop()
	for {
		select {
		case <-stop:
			return
		case <-beats:
			if !r.heartbeat() {
				hb.Stop()
				beats = nil
			}
		case <-r.arm:
			r.flushWhenDue(flush)
		case <-flush.C:
			r.flushWhenDue(flush)
		}
	}
}

// flushWhenDue flushes pending output that has waited CoalesceDelay, or sets
// t for when it will have.
func (r *attemptRun) flushWhenDue(t *time.Timer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || r.pend.empty() {
		return
	}
	if wait := time.Until(r.pendingSince.Add(r.w.cfg.CoalesceDelay)); wait > 0 {
		t.Reset(wait)
		return
	}
	r.flushLocked(false)
}
