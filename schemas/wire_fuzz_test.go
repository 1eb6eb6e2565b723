package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// wireKinds are the messages read off NATS with Decode or DecodeReply —
// the dispatcher's replies, the worker's attempts and cancels, the NATS
// door's submit requests — and the records their consumers read, each with
// a constructor for an empty value.
var wireKinds = []struct {
	kind  string
	empty func() any
}{
	{KindAttempt, func() any { return new(Attempt) }},
	{KindCancel, func() any { return new(Cancel) }},
	{KindAccept, func() any { return new(Accept) }},
	{KindBusy, func() any { return new(Busy) }},
	{KindHeartbeat, func() any { return new(Heartbeat) }},
	{KindFirstByte, func() any { return new(FirstByte) }},
	{KindChunk, func() any { return new(Chunk) }},
	{KindAttemptResult, func() any { return new(AttemptResult) }},
	{KindSubmitRequest, func() any { return new(SubmitRequest) }},
	{KindSubmitResponse, func() any { return new(SubmitResponse) }},
	{KindSubmitChunk, func() any { return new(SubmitChunk) }},
	{KindAttemptRecord, func() any { return new(AttemptRecord) }},
	{KindGroupRecord, func() any { return new(GroupRecord) }},
	{KindSupersededRecord, func() any { return new(SupersededRecord) }},
}

// checkWireMessageRoundTrips fails t unless, for every wire kind, Decode
// either accepts data and the value re-encodes to bytes that decode to the
// same value (encoding it again gives the same bytes), or refuses it with an
// error the callers can tell apart: a version error (ErrUnsupportedVersion,
// which the worker counts as DropVersion) or a JSON decoding error.
// DecodeReply must agree with Decode of the type it names.
func checkWireMessageRoundTrips(t *testing.T, data []byte) {
	t.Helper()
	for _, k := range wireKinds {
		v := k.empty()
		if err := Decode(data, v); err != nil {
			checkDecodeError(t, k.kind, data, err)
			continue
		}
		checkReencodes(t, k.kind, v, k.empty)
	}
	r, err := DecodeReply(data)
	if err != nil {
		if errors.Is(err, ErrUnsupportedVersion) {
			return
		}
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		if !errors.As(err, &syntax) && !errors.As(err, &typ) && newReply(replyTypeOf(data)) != nil {
			t.Fatalf("DecodeReply(%q) of a known type: untyped error %v", data, err)
		}
		return
	}
	same := newReply(string(r.ReplyType()))
	if err := Decode(data, same); err != nil || !reflect.DeepEqual(r, same) {
		t.Fatalf("DecodeReply(%q) = %+v, Decode into %T = %+v (%v)", data, r, same, same, err)
	}
	checkReencodes(t, string(r.ReplyType()), r, func() any { return newReply(string(r.ReplyType())) })
}

// replyTypeOf is the "type" member of a message, "" when it has none.
func replyTypeOf(data []byte) string {
	var head struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(data, &head)
	return head.Type
}

// checkDecodeError fails t unless err is a version error or wraps one of
// encoding/json's decoding errors, or the message's commit point is one
// ParseCommitPoint refuses.
func checkDecodeError(t *testing.T, kind string, data []byte, err error) {
	t.Helper()
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, ErrUnsupportedVersion), errors.As(err, &syntax), errors.As(err, &typ), badCommitPoint(data):
	default:
		t.Fatalf("Decode(%q) into %s: error %v (%T) is neither a version error nor a decoding error", data, kind, err, errors.Unwrap(err))
	}
}

// badCommitPoint reports that data has a string commit_point that
// ParseCommitPoint refuses.
func badCommitPoint(data []byte) bool {
	var head struct {
		CommitPoint *string `json:"commit_point"`
	}
	if json.Unmarshal(data, &head) != nil || head.CommitPoint == nil {
		return false
	}
	_, err := ParseCommitPoint(*head.CommitPoint)
	return err != nil
}

// noCommitPoint reports that v is a message with a CommitPoint member left
// at its zero value.
func noCommitPoint(v any) bool {
	f := reflect.ValueOf(v).Elem().FieldByName("CommitPoint")
	return f.IsValid() && f.Interface() == CommitPoint{}
}

// checkReencodes fails t unless v encodes to bytes Decode accepts into a
// value equal to v after one more encode: the encoding is a fixed point.
func checkReencodes(t *testing.T, kind string, v any, empty func() any) {
	t.Helper()
	b1, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: decoded %+v does not encode: %v", kind, v, err)
	}
	v2 := empty()
	if err := Decode(b1, v2); err != nil {
		if noCommitPoint(v) && badCommitPoint(b1) {
			// The zero commit point encodes as "", which no reader takes:
			// a message without one is refused by its reader (the worker
			// drops such an attempt as malformed), never re-sent.
			return
		}
		t.Fatalf("%s: re-encoded %s does not decode: %v", kind, b1, err)
	}
	b2, err := json.Marshal(v2)
	if err != nil {
		t.Fatalf("%s: %+v does not encode: %v", kind, v2, err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("%s: encode, decode, encode changed the message:\n%s\n%s", kind, b1, b2)
	}
	v3 := empty()
	if err := Decode(b2, v3); err != nil || !reflect.DeepEqual(v2, v3) {
		t.Fatalf("%s: decoding %s twice gave %+v and %+v (%v)", kind, b2, v2, v3, err)
	}
}

// FuzzWireMessageRoundTrips runs checkWireMessageRoundTrips on every
// sample message (minimal and full) and the one-pass decode's odd cases.
func FuzzWireMessageRoundTrips(f *testing.F) {
	for _, s := range samples() {
		for _, m := range []kinded{s.minimal, s.full} {
			b, err := json.Marshal(m)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	for _, c := range headCases {
		f.Add([]byte(c))
	}
	f.Add([]byte(`{"v":1,"group_id":"g","commit_point":"tokens:+5","request":{"messages":[{"role":"user","content":"hi"}]}}`))
	f.Fuzz(checkWireMessageRoundTrips)
}
