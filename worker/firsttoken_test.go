package worker

import (
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// A provider that opens its stream at once and produces its first token
// only at the drawn first byte: the attempt's FirstByte is that token, and
// heartbeats cover the wait, for streaming and non-streaming callers alike
// (the worker streams from the provider either way).
func TestFirstByteIsTheFirstTokenOfAStreamOpenedEarly(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := map[bool]string{true: "streaming", false: "non-streaming"}[stream]
		t.Run(name, func(t *testing.T) {
			// The first token after 50 ms, heartbeats every 5 ms.
			h := newHarness(t, setup{fake: fakellm.Config{Model: model(t, 50, 20, 1000), OpenEarly: true}})
			att := h.attempt("hg_open_early_" + name)
			att.Request.Stream = stream
			if !stream {
				att.CommitPoint = schemas.Complete
			}
			in := h.send(att)
			in.accept()
			rs, res := in.untilResult()
			_, heartbeats, firstByte := checkStream(t, rs)
			if !firstByte || heartbeats == 0 {
				t.Fatalf("replies %v: want heartbeats while the stream is open without a token, then a first byte", kinds(rs))
			}
			// The token cannot come before the drawn first byte; the
			// stream's opening did, at once.
			if res.StatusClass != schemas.StatusOK || res.HTTPStatus != 200 || res.FirstByteMs == nil || *res.FirstByteMs < 50 {
				t.Errorf("result %s, http %d, first_byte_ms %v: want ok, 200 and the first byte at the token (≥ 50 ms)",
					res.StatusClass, res.HTTPStatus, res.FirstByteMs)
			}
			if rec := h.record(); rec.FirstByteMs == nil || *rec.FirstByteMs < 50 {
				t.Errorf("record first_byte_ms %v, want the first token's (≥ 50 ms)", rec.FirstByteMs)
			}
		})
	}
}

// A provider that opens its stream and then produces nothing keeps the
// attempt beating: the dispatcher's heartbeat timeout must not take a
// silent model for a lost worker, and only a first token ends the beats.
func TestHeartbeatsGoOnWhileAnOpenStreamHasNoToken(t *testing.T) {
	h := newHarness(t, setup{fake: fakellm.Config{Model: hangModel(t), OpenEarly: true}})
	att := h.attempt("hg_open_silent")
	in := h.send(att)
	acc := in.accept()
	// The stream opens at once; many heartbeat intervals later it has
	// still sent no token, and the heartbeats still come.
	const beats = 20
	var before []schemas.Reply
	for len(before) < beats {
		r := in.next()
		if _, ok := r.(*schemas.Heartbeat); !ok {
			t.Fatalf("got %s after %d heartbeats, want only heartbeats from a stream without a token", r.ReplyType(), len(before))
		}
		before = append(before, r)
	}
	h.cancel(acc, schemas.CancelLostRace)
	rs, res := in.untilResult()
	if _, _, firstByte := checkStream(t, append(before, rs...)); firstByte {
		t.Errorf("replies %v: a first byte without a token", kinds(rs))
	}
	if res.StatusClass != schemas.StatusCanceled || res.FirstByteMs != nil {
		t.Errorf("result %s, first_byte_ms %v: want canceled without a first byte", res.StatusClass, res.FirstByteMs)
	}
	if prov := h.prov.record(t); prov.Status != 200 || prov.TokensSent != 0 {
		t.Errorf("provider record %+v: want a stream opened with 200 that sent no token", prov)
	}
}
