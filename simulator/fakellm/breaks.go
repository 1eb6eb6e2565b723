package fakellm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"
)

// BreakMode is how a stream the fake breaks after its commit fails.
type BreakMode string

// The break modes.
const (
	// BreakCut closes the connection mid-stream: no final event, no [DONE],
	// the body ends unexpectedly. The handler panics with
	// http.ErrAbortHandler, which net/http answers by dropping the
	// connection; a wrapper that recovers panics must panic it again.
	BreakCut BreakMode = "cut"
	// BreakError sends the dialect's in-band error event (a chat chunk
	// holding {"error":{...}}, Anthropic's event: error, the Responses
	// API's error event) and ends the stream.
	BreakError BreakMode = "error"
	// BreakStall stops sending and holds the connection open until the
	// client goes away (or the server closes) — or, with
	// Options.BreakStallFor, until that much model time has passed, when
	// the stream resumes where it stopped and completes as it would have,
	// its remaining tokens at the model's pace from then on.
	BreakStall BreakMode = "stall"
	// BreakMalformed sends one malformed event — the next token's event
	// cut off before its text, so its data line is not valid JSON (a
	// proxy or a provider that fails halfway through writing a chunk) —
	// and then ends the response: no final event, no [DONE], the body
	// closed cleanly.
	BreakMalformed BreakMode = "malformed"
	// BreakTruncate ends the stream normally but early: the final events
	// as for an answer cut at its length limit (finish_reason length in
	// OpenAI chat, status incomplete with incomplete_details.reason
	// max_output_tokens in Responses, stop_reason max_tokens in Anthropic
	// Messages), the usage counting the tokens sent — a provider cutting
	// an answer below the max_tokens asked. Its record ends completed,
	// finish length, with the break named.
	BreakTruncate BreakMode = "truncate"
)

// BreakModes lists the break modes, the default first.
var BreakModes = []BreakMode{BreakCut, BreakError, BreakStall, BreakMalformed, BreakTruncate}

// ParseBreakMode returns the mode s names; empty is BreakCut.
func ParseBreakMode(s string) (BreakMode, error) {
	return parseName("break mode", s, BreakModes)
}

// StreamBreaks reports whether a route of seed breaks its streaming answer
// to the request requestID when it breaks a share of streams: a draw from
// the seed, the route and the request id alone, so a test can predict it
// and a request's copies on two faulty routes break independently. The
// answer breaks only if it is longer than Options.BreakAfter tokens, and
// never when it is a continuation.
func StreamBreaks(seed uint64, route int, requestID uint64, share float64) bool {
	if share <= 0 {
		return false
	}
	const domainBreak = 0x6272_6561_6b73 // "breaks": keeps this draw apart from others of the seed
	r := rand.New(rand.NewPCG(seed^domainBreak, requestID^uint64(route)*0x9e3779b97f4a7c15))
	return r.Float64() < share
}

// checkBreaks validates the break options.
func checkBreaks(cfg Options) error {
	switch {
	case !(cfg.BreakShare >= 0 && cfg.BreakShare <= 1):
		return fmt.Errorf("%w: break share %v is outside [0, 1]", ErrInvalidOptions, cfg.BreakShare)
	case cfg.BreakAfter < 0:
		return fmt.Errorf("%w: break after %d tokens is negative", ErrInvalidOptions, cfg.BreakAfter)
	case cfg.BreakStallFor < 0:
		return fmt.Errorf("%w: break stall for %v is negative", ErrInvalidOptions, cfg.BreakStallFor)
	}
	mode, err := ParseBreakMode(string(cfg.BreakMode))
	if err != nil {
		return err
	}
	if cfg.BreakStallFor > 0 && mode != BreakStall {
		// Only a stall can resume: refused rather than ignored, so a
		// fault meant to heal is not a cut that never does.
		return fmt.Errorf("%w: break stall for %v with break mode %s: only a %s resumes", ErrInvalidOptions,
			cfg.BreakStallFor, mode, BreakStall)
	}
	return nil
}

// truncate makes the exchange an answer cut at its length limit after
// Options.BreakAfter tokens (BreakTruncate): the attempt's answer is that
// long and finishes "length", so the stream sends those tokens at the
// model's pace and then its ordinary final events, with usage counting
// them. full keeps the answer's length for the record.
func (ex *exchange) truncate(after int) {
	ex.full = ex.att.Request.OutputTokens
	ex.att.Request.OutputTokens, ex.finish = after, "length"
}

// malformedEvent appends the event of the stream's next token cut off
// before the token's text, ended as an event: a data line that is not
// valid JSON in every dialect, in the place a token's event comes, and no
// output a lenient reader could take for text.
func (ex *exchange) malformedEvent(buf *bytes.Buffer) {
	var ev bytes.Buffer
	word := ex.answer.token(ex.sent + 1)
	ex.d.streamToken(&ev, ex, word)
	event := bytes.TrimRight(ev.Bytes(), "\n")
	quoted, err := json.Marshal(word)
	cut := bytes.LastIndex(event, quoted)
	if err != nil || cut < 0 {
		cut = len(event) / 2 // cannot happen: the event holds the word as JSON
	}
	buf.Write(event[:cut])
	buf.WriteString("\n\n")
}

// breakStream breaks a stream whose first ex.sent tokens are out, as
// ex.brk says, and reports whether the stream goes on: only a stall with
// Options.BreakStallFor does, once that much model time has passed with
// the client still there; the time it stalled is added to ex.paused. A
// cut aborts the handler, which net/http answers by closing the
// connection without the response's end.
func (ex *exchange) breakStream(rc *http.ResponseController, buf *bytes.Buffer) (resumed bool) {
	ex.end = EndBroken
	switch ex.brk {
	case BreakCut:
		panic(http.ErrAbortHandler)
	case BreakError:
		ex.d.streamError(buf, errTypeServer, errCodeStreamBroken,
			"The server had an error while processing your request. Sorry about that!")
		ex.write(rc, buf)
	case BreakMalformed:
		ex.malformedEvent(buf)
		ex.write(rc, buf)
	case BreakStall:
		if ex.s.breakStallFor == 0 {
			ex.waitReal(nil)
			break
		}
		from := ex.s.now()
		if ex.waitReal(time.NewTimer(ex.s.scale.Real(ex.s.breakStallFor))) {
			ex.end, ex.resumed, ex.paused = "", true, ex.paused+ex.s.now().Sub(from)
			return true
		}
	}
	ex.end = EndBroken // a stall ends when the client leaves; it still broke
	return false
}
