package fakellm

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hedgerow/hedgerow/simulator/workload"
)

// minFlushInterval is the least real time between two writes of a stream.
// Tokens due within it go out together: at a time scale of 0.02 the model's
// 7.7 ms inter-token latency is 154 µs of real time, and one write per
// token would measure the server's syscalls rather than the model. A token
// is therefore sent up to this much after its model time says.
const minFlushInterval = time.Millisecond

const systemFingerprint = "fp_hedgerow_fakellm"

// handleChat answers POST /v1/chat/completions as the drawn attempt says.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	s.serveChat(w, r, chatCompletions{})
}

// handleMessages answers POST /v1/messages, Anthropic's Messages API, with
// the same draw a chat completion of the same conversation gets.
func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	s.serveChat(w, r, messagesAPI{})
}

// serveChat answers one chat request in dialect d: the drawn attempt, its
// timing and its billing are the dialect's business only in how they are
// written.
func (s *Server) serveChat(w http.ResponseWriter, r *http.Request, d dialect) {
	select {
	case <-s.closed:
		d.writeError(w, http.StatusServiceUnavailable, errTypeServer, errCodeShuttingDown, "", "The server is shutting down.")
		return
	default:
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		s.stats.invalid()
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			d.writeError(w, http.StatusRequestEntityTooLarge, errTypeInvalidRequest, errCodeBodyTooLarge, "",
				fmt.Sprintf("The request body is larger than %d bytes.", s.maxBody))
			return
		}
		d.writeError(w, http.StatusBadRequest, errTypeInvalidRequest, errCodeInvalidBody, "",
			fmt.Sprintf("The request body could not be read: %v", err))
		return
	}
	p, err := d.parse(body, s.gen.Model().MaxOutputTokens, s.style)
	var plan answerPlan
	if err == nil {
		plan, err = s.plan(p)
	}
	if err != nil {
		s.stats.invalid()
		re := &requestError{code: errCodeInvalidParams, message: err.Error()}
		errors.As(err, &re)
		d.writeError(w, http.StatusBadRequest, errTypeInvalidRequest, re.code, re.param, re.message)
		return
	}

	start := s.now()
	number := int(s.attempts.Add(1))
	att, err := s.provider.Attempt(plan.req, number, s.modelSince(start))
	if err != nil {
		// A parsed request always makes a valid attempt; this is a bug.
		d.writeError(w, http.StatusInternalServerError, errTypeServer, "", "", fmt.Sprintf("drawing the attempt: %v", err))
		return
	}
	// An empty continuation (the partial was the whole answer) is drawn
	// as one token long, the least an attempt can be, and sends none.
	att.Request.OutputTokens = plan.tokens
	ex := &exchange{
		s: s, d: d, w: w, ctx: r.Context(), att: att, p: p, start: start, finish: plan.finish,
		answer: plan.answer, partialTokens: plan.partialTokens,
		id:    d.id(p.requestID, s.route, number),
		model: cmp.Or(p.model, s.modelID),
	}
	if p.stream && att.Outcome == workload.OutcomeOK && p.cont == nil && plan.tokens > s.breakAfter &&
		StreamBreaks(s.gen.Seed(), s.route, p.requestID, s.breakShare) {
		ex.brk = s.breakMode
		if ex.brk == BreakTruncate {
			ex.truncate(s.breakAfter)
		}
	}
	s.stats.begin()
	defer s.record(ex)
	if s.onStart != nil {
		s.onStart()
	}
	ex.run()
}

// answerPlan is what a parsed request will be answered: the request the
// attempt is drawn for, the answer's tokens and how it finishes.
type answerPlan struct {
	req    workload.Request
	answer answer
	tokens int
	finish string
	// partialTokens is how many tokens of the full answer a
	// continuation's partial touched.
	partialTokens int
}

// plan decides the answer to p. Its length and input tokens come from the
// fixed-seed text draw of the conversation, so every route and seed
// answers the same text; the cap cuts it (finish "length"). A
// continuation answers the rest of the full text after its partial, which
// must be a prefix of it; its input is the conversation's plus the tokens
// the partial touched, and its cap counts only the new tokens, as
// providers' caps do.
func (s *Server) plan(p chatParams) (answerPlan, error) {
	text := s.text.Request(p.textID)
	pl := answerPlan{
		req:    workload.Request{ID: p.requestID, InputTokens: text.InputTokens, Short: text.Short},
		answer: answer{textID: p.textID},
		tokens: text.OutputTokens,
		finish: "stop",
	}
	if p.cont != nil {
		a, touched, err := continueFrom(p.textID, text.OutputTokens, p.cont.partial)
		if err != nil {
			return answerPlan{}, err
		}
		pl.answer, pl.partialTokens = a, touched
		pl.tokens -= a.skip
		pl.req.InputTokens += touched
	}
	if p.maxTokens > 0 && pl.tokens > p.maxTokens {
		pl.tokens, pl.finish = p.maxTokens, "length"
	}
	pl.req.OutputTokens = max(pl.tokens, 1)
	return pl, nil
}

// exchange is one chat request in progress: the drawn attempt and what has
// been sent for it so far.
type exchange struct {
	s      *Server
	d      dialect
	w      http.ResponseWriter
	ctx    context.Context
	att    workload.Attempt
	p      chatParams
	id     string
	model  string
	start  time.Time // when the attempt reached the provider
	finish string    // the canonical finish reason of a complete answer: stop or length
	answer answer    // the tokens the answer sends
	// partialTokens is the full answer's tokens a continuation's partial
	// touched; 0 for other requests.
	partialTokens int
	brk           BreakMode // the break this stream suffers; empty for none
	// full is the answer's length before a BreakTruncate cut it; 0 for
	// an answer not truncated.
	full int
	// resumed says the stream's stall resumed (Options.BreakStallFor), and
	// paused is the real time it held the stream: the tokens after it are
	// that much late.
	resumed bool
	paused  time.Duration

	status     int       // HTTP status sent; 0 until one is
	firstByte  time.Time // when the first byte of the answer was written
	sent       int       // output tokens written
	end        EndReason // empty: completed
	disconnect time.Time // when the client or Close ended it
}

func (ex *exchange) run() {
	att := &ex.att
	switch att.Outcome {
	case workload.OutcomeOK:
		if ex.p.stream {
			ex.stream()
		} else {
			ex.complete()
		}
	case workload.OutcomeServerError:
		if ex.waitFor(att.End) {
			ex.writeError(http.StatusInternalServerError, errTypeServer, "",
				"The server had an error while processing your request. Sorry about that!")
		}
	case workload.OutcomeRateLimited:
		if ex.waitFor(att.End) {
			ex.rateLimited()
		}
	case workload.OutcomeHang:
		// Nothing is sent, or with OpenEarly nothing after the stream's
		// opening: the client's deadline or a hedge has to end it.
		if ex.s.early && ex.p.stream {
			ex.hangOpen()
			return
		}
		if ex.waitFor(ex.s.hangCap) {
			ex.end = EndHangCapped
			ex.writeError(http.StatusGatewayTimeout, errTypeTimeout, errCodeHangCapped,
				fmt.Sprintf("The provider sent nothing within %v of model time.", ex.s.hangCap))
		}
	default:
		ex.writeError(http.StatusInternalServerError, errTypeServer, "", fmt.Sprintf("unknown drawn outcome %v", att.Outcome))
	}
}

// elapsed returns the model time from the attempt's start to real instant t.
func (ex *exchange) elapsed(t time.Time) time.Duration {
	return max(ex.s.scale.Model(t.Sub(ex.start)), 0)
}

// progress returns how far the model's generation had come at real
// instant t: its elapsed time less the stalls it resumed from, during which
// it produced nothing.
func (ex *exchange) progress(t time.Time) time.Duration {
	return ex.elapsed(t.Add(-ex.paused))
}

// waitFor waits until model time at into the attempt; false means the
// exchange was ended meanwhile (and is recorded as such).
func (ex *exchange) waitFor(at time.Duration) bool {
	wait := ex.s.scale.Real(at)
	if wait == workload.Never {
		return ex.waitReal(nil)
	}
	return ex.waitReal(time.NewTimer(ex.start.Add(wait).Sub(ex.s.now())))
}

// waitUntil waits until real instant t, as waitFor.
func (ex *exchange) waitUntil(t time.Time) bool {
	return ex.waitReal(time.NewTimer(t.Sub(ex.s.now())))
}

// waitReal waits for timer to fire (nil: forever) unless the client goes
// away or the server closes first, which it records and reports as false.
func (ex *exchange) waitReal(timer *time.Timer) bool {
	var fired <-chan time.Time
	if timer != nil {
		defer timer.Stop()
		fired = timer.C
	}
	// An exchange already ended must not win against an expired timer.
	select {
	case <-ex.ctx.Done():
		ex.stop(EndDisconnected)
		return false
	case <-ex.s.closed:
		ex.stop(EndShutdown)
		return false
	default:
	}
	select {
	case <-fired:
		return true
	case <-ex.ctx.Done():
		ex.stop(EndDisconnected)
	case <-ex.s.closed:
		ex.stop(EndShutdown)
	}
	return false
}

// stop records that the exchange ended early; on shutdown, a client that
// has been sent nothing gets a clear 503 rather than an empty reply.
func (ex *exchange) stop(reason EndReason) {
	ex.end, ex.disconnect = reason, ex.s.now()
	if reason == EndShutdown && ex.status == 0 {
		ex.writeError(http.StatusServiceUnavailable, errTypeServer, errCodeShuttingDown, "The server is shutting down.")
	}
}

func (ex *exchange) writeError(status int, typ, code, message string) {
	ex.status = status
	ex.d.writeError(ex.w, status, typ, code, "", message)
}

// rateLimited answers 429. Retry-After is in real seconds, rounded up,
// because clients wait in real time; since whole seconds are far too
// coarse under a time scale, retry-after-ms (which the official OpenAI SDKs
// read first) carries the real wait to the millisecond.
func (ex *exchange) rateLimited() {
	wait := ex.s.scale.Real(ex.att.RetryAfter)
	h := ex.w.Header()
	h.Set("Retry-After", strconv.FormatInt(ceilDiv(wait, time.Second), 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(ceilDiv(wait, time.Millisecond), 10))
	ex.writeError(http.StatusTooManyRequests, errTypeRateLimit, errCodeRateLimit,
		fmt.Sprintf("Rate limit reached for route %d of %s. Please try again in %v.", ex.s.route, ex.s.workload, wait))
}

// ceilDiv returns d/unit rounded up, at least 1 for a positive d.
func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + unit - 1) / unit)
}

// complete answers a non-streaming request once the whole answer exists.
func (ex *exchange) complete() {
	if !ex.waitFor(ex.att.End) {
		return
	}
	n := ex.att.Request.OutputTokens
	var text strings.Builder
	for k := 1; k <= n; k++ {
		text.WriteString(ex.answer.token(k))
	}
	ex.status, ex.firstByte, ex.sent = http.StatusOK, ex.s.now(), n
	writeJSON(ex.w, http.StatusOK, ex.d.completion(ex, text.String()))
}

// stream answers a streaming request: headers and the role chunk at the
// first byte (with OpenEarly, at once), then the tokens as the model
// produces them from the first byte on, several per write when they fall
// within minFlushInterval of each other.
func (ex *exchange) stream() {
	att := &ex.att
	if !ex.s.early && !ex.waitFor(att.FirstByte) {
		return
	}
	var buf bytes.Buffer
	rc := ex.openStream(&buf)
	if ex.s.early {
		if !ex.write(rc, &buf) || !ex.waitFor(att.FirstByte) {
			return
		}
	}
	n := att.Request.OutputTokens
	// stop is the tokens sent before the stream ends or breaks; a
	// truncated answer is n tokens long and ends as a whole one does.
	stop := n
	if ex.brk != "" && ex.brk != BreakTruncate {
		stop = ex.s.breakAfter
	}
	for {
		// Progress by at least one token per wake, whatever the clock says.
		due := min(max(att.TokensBy(ex.progress(ex.s.now())), ex.sent+1), stop)
		for k := ex.sent + 1; k <= due; k++ {
			ex.d.streamToken(&buf, ex, ex.answer.token(k))
		}
		if due == n {
			ex.d.streamEnd(&buf, ex)
		}
		if !ex.write(rc, &buf) {
			return
		}
		if ex.firstByte.IsZero() && (due > 0 || due == n) {
			ex.firstByte = ex.s.now()
		}
		ex.sent = due
		if due == n {
			return
		}
		if due == stop {
			if !ex.breakStream(rc, &buf) {
				return
			}
			stop = n // a stall resumed: the rest of the answer follows
		}
		next := ex.start.Add(ex.paused + ex.s.scale.Real(att.TokenTime(due+1)))
		if earliest := ex.s.now().Add(minFlushInterval); next.Before(earliest) {
			next = earliest
		}
		if !ex.waitUntil(next) {
			return
		}
	}
}

// openStream sends the stream's headers and appends its opening events to
// buf; the returned controller flushes what is written.
func (ex *exchange) openStream(buf *bytes.Buffer) *http.ResponseController {
	h := ex.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	ex.w.WriteHeader(http.StatusOK)
	ex.status = http.StatusOK
	ex.d.streamStart(buf, ex)
	return http.NewResponseController(ex.w)
}

// write sends and flushes buf, then empties it; false means the client
// went away (and the exchange is recorded as such).
func (ex *exchange) write(rc *http.ResponseController, buf *bytes.Buffer) bool {
	_, err := ex.w.Write(buf.Bytes())
	if err == nil {
		err = rc.Flush()
	}
	buf.Reset()
	if err != nil {
		ex.stop(EndDisconnected)
		return false
	}
	return true
}

// hangOpen plays a hung attempt behind an early-opened stream: the opening
// at once, then silence until the hang cap, which ends the stream with an
// error event, as a provider's gateway timing out a stuck model does.
func (ex *exchange) hangOpen() {
	var buf bytes.Buffer
	rc := ex.openStream(&buf)
	if !ex.write(rc, &buf) || !ex.waitFor(ex.s.hangCap) {
		return
	}
	ex.end = EndHangCapped
	ex.d.streamError(&buf, errTypeTimeout, errCodeHangCapped,
		fmt.Sprintf("The provider sent nothing within %v of model time.", ex.s.hangCap))
	ex.write(rc, &buf)
}

// record stores the exchange's record with what the provider bills for it.
func (s *Server) record(ex *exchange) {
	att := &ex.att
	rec := Record{
		RequestID:    ex.p.requestID,
		Attempt:      att.Number,
		Route:        att.Route,
		StartUnixMs:  ex.start.UnixMilli(),
		EndUnixMs:    s.now().UnixMilli(),
		ModelStartMs: millis(att.Start),
		Outcome:      att.Outcome.String(),
		Degraded:     att.Degraded,
		Stalled:      att.Stalled,
		Stream:       ex.p.stream,
		Status:       ex.status,
		End:          cmp.Or(ex.end, EndCompleted),
		OutputTokens: cmp.Or(ex.full, att.Request.OutputTokens),
		TokensSent:   ex.sent,
	}
	if att.Outcome == workload.OutcomeOK {
		rec.FirstByteModelMs = ptr(millis(att.FirstByte))
		if rec.End == EndCompleted {
			rec.FinishReason = ex.finish
		}
	}
	if !ex.firstByte.IsZero() {
		rec.FirstByteRealMs = ptr(millis(ex.firstByte.Sub(ex.start)))
	}
	if p := ex.p.cont; p != nil {
		rec.Continuation, rec.PartialTokens = p.style, ex.partialTokens
	}
	disconnectAt := workload.Never
	if !ex.disconnect.IsZero() {
		disconnectAt = ex.progress(ex.disconnect)
		rec.DisconnectUnixMs = ptr(ex.disconnect.UnixMilli())
		rec.DisconnectModelMs = ptr(millis(disconnectAt))
	}
	billed := att.BilledUsage(disconnectAt)
	rec.BilledInputTokens = billed.InputUnits
	// A provider bills at least what it sent, whatever a skewed injected
	// clock makes of the disconnect time.
	rec.BilledOutputTokens = max(billed.OutputUnits, int64(ex.sent))
	if rec.End == EndBroken {
		// The provider stopped producing where the stream broke.
		rec.Break, rec.BilledOutputTokens = ex.brk, int64(ex.sent)
	}
	if ex.resumed || ex.brk == BreakTruncate {
		rec.Break = ex.brk // a stall that resumed, a truncated answer; End says how it ended
	}

	rec = s.stats.finish(rec)
	if s.onRecord != nil {
		s.onRecord(rec)
	}
}

// millis returns d in fractional milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ptr[T any](v T) *T { return &v }
