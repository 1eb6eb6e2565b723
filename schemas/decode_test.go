package schemas

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// headCases are wire messages, plain and odd, on which the one-pass decode
// must agree with the careful one. They seed FuzzDecodeAgreesWithCarefulDecode.
var headCases = []string{
	`{"v":1,"type":"chunk","group_id":"g","attempt":1,"seq":1,"delta":"hi","tokens":1,"cumulative_tokens":1}`,
	`{"v":1,"type":"accept","group_id":"g","attempt":1,"worker_id":"w","control_inbox":"_INBOX.x"}`,
	`{"v":1,"type":"result","group_id":"g","attempt":1,"status_class":"ok","error_scope":"none","content":"a \"b\" \u00e9","last_seq":0,"usage":{"input_units":1,"output_units":2}}`,
	`{"v":1,"group_id":"g","attempt":2,"reason":"deadline"}`,
	` { "v" : 1 , "type" : "busy" , "group_id" : "g" } `,
	`{"type":"heartbeat","group_id":"g","v":1,"seq":3}`,
	`{"v":1,"type":"chunk","request":{"v":2,"type":"x","nested":[{"v":3},"}",{"a":"]"}]}}`,
	`{"v":2,"type":"chunk","group_id":"g"}`,
	`{"v":0,"type":"chunk"}`,
	`{"v":null,"type":"chunk"}`,
	`{"type":"chunk"}`,
	`{"v":"1","type":"chunk"}`,
	`{"v":1.0,"type":"chunk"}`,
	`{"v":1e0,"type":"chunk"}`,
	`{"v":-1,"type":"chunk"}`,
	`{"v":1,"v":2,"type":"chunk"}`,
	`{"v":2,"v":1,"type":"chunk"}`,
	`{"V":2,"v":1,"type":"chunk"}`,
	`{"v":1,"V":2,"type":"chunk"}`,
	`{"\u0076":2,"v":1,"type":"chunk"}`,
	`{"v":1,"type":"chunk","Type":"accept"}`,
	`{"v":1,"type":"chunk","type":"accept"}`,
	`{"v":1,"type":"\u0063hunk"}`,
	`{"v":1,"type":7}`,
	`{"v":1,"type":null}`,
	`{"v":1,"type":"gossip"}`,
	`{"v":1}`,
	`{"v":1,"type":"chunk","seq":"x"}`,
	`{"v":1,"type":"chunk","attempt":1.5}`,
	`{"v":1,"type":"chunk","group_id":"g",}`,
	`{"v":1,"type":"chunk"} x`,
	`{"v":1,"type":"chunk"`,
	`{"v":1,"type":"chu`,
	`{"v":1,`,
	`{"v":1 2}`,
	`{"v" 1}`,
	`{}`,
	`[]`,
	`null`,
	`"v"`,
	``,
	`{"v":1,"type":"result","group_id":"g","attempt":1,"content":null,"tool_calls":null,"first_byte_ms":null,"usage":null}`,
	`{"v":1,"type":"result","group_id":"g","attempt":1,"tool_calls":[{"id":"c","function":{"arguments":"{\"a\":1}"}}],"first_byte_ms":12,"usage":{"input_units":3,"output_units":4,"estimated":true,"extra":[1,{"x":null}]}}`,
	`{"v":1,"type":"result","usage":{"input_units":3,"input_units":4}}`,
	`{"v":1,"type":"result","usage":{"Input_Units":3}}`,
	`{"v":1,"type":"result","usage":[]}`,
	`{"v":1,"type":"result","usage":{"estimated":1}}`,
	`{"v":1,"type":"result","first_byte_ms":"1"}`,
	`{"v":1,"type":"result","first_byte_ms":1.5}`,
	`{"v":1,"type":"result","status_class":"ok","max_token_gap_ms":42}`,
	`{"v":1,"type":"result","max_token_gap_ms":"42"}`,
	`{"v":1,"type":"result","max_token_gap_ms":null}`,
	`{"v":1,"type":"result","cancellation_observed":null,"http_status":null,"status_class":null}`,
	`{"v":1,"type":"result","http_status":9223372036854775808}`,
	`{"v":1,"type":"result","status_class":"ok","error_message":"a\u0000b \ud800 \n"}`,
	"{\"v\":1,\"type\":\"result\",\"content\":\"caf\xc3\xa9 \xff\"}",
	`{"v":1,"type":"chunk","first":true,"first":false}`,
	`{"v":1,"type":"chunk","First":true}`,
	`{"v":1,"type":"chunk","first":"true"}`,
	`{"v":1,"type":"chunk","delta":"x","tool_calls":{"weird":true},"tokens":-3}`,
	`{"v":1,"type":"chunk","tool_calls":tru}`,
	`{"v":1,"type":"accept","control_inbox":"_INBOX.a","worker_id":7}`,
	`{"v":1,"type":"heartbeat","seq":1e3}`,
	`{"v":1,"type":"heartbeat","seq":-0}`,
	`{"v":1,"type":"busy","deep":` + strings.Repeat(`[`, 100) + strings.Repeat(`]`, 100) + `}`,
	`{"v":1,"type":"first_byte","elapsed_ms":5,}`,
	`{"v":1,"type":"first_byte","elapsed_ms":5}}`,
}

// checkDecodeAgrees fails t unless Decode and DecodeReply answer data as
// their careful versions do: the same value, or the same error.
func checkDecodeAgrees(t *testing.T, data []byte) {
	t.Helper()
	for _, target := range []func() any{
		func() any { return new(Cancel) },
		func() any { return new(Attempt) },
		func() any { return new(AttemptResult) },
	} {
		got, want := target(), target()
		gotErr, wantErr := Decode(data, got), decodeCarefully(data, want)
		if !sameError(gotErr, wantErr) {
			t.Fatalf("Decode(%q) into %T: error %v, careful decode: %v", data, got, gotErr, wantErr)
		}
		if gotErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("Decode(%q) = %+v, careful decode = %+v", data, got, want)
		}
	}
	got, gotErr := DecodeReply(data)
	want, wantErr := decodeReplyCarefully(data)
	if !sameError(gotErr, wantErr) {
		t.Fatalf("DecodeReply(%q): error %v, careful decode: %v", data, gotErr, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("DecodeReply(%q) = %+v, careful decode = %+v", data, got, want)
	}
}

func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Error() == b.Error()
}

func TestDecodeInOnePassAgreesWithTheCarefulDecode(t *testing.T) {
	for _, c := range headCases {
		t.Run(c, func(t *testing.T) { checkDecodeAgrees(t, []byte(c)) })
	}
	for _, s := range samples() {
		t.Run(s.kind, func(t *testing.T) { checkDecodeAgrees(t, mustMarshal(t, s.full)) })
	}
}

// TestEveryMessageOfThisVersionTakesTheOnePassDecode checks that what this
// binary sends is read in one pass, not the careful way.
func TestEveryMessageOfThisVersionTakesTheOnePassDecode(t *testing.T) {
	for _, s := range samples() {
		if !versioned(s.kind) {
			continue
		}
		for _, m := range []kinded{s.minimal, s.full} {
			data := mustMarshal(t, m)
			typ, ok := peekHead(data)
			if !ok {
				t.Errorf("%s: peekHead declined %s", s.kind, data)
			}
			if r, isReply := m.(Reply); isReply && string(typ) != string(r.ReplyType()) {
				t.Errorf("%s: peekHead type %q, want %q", s.kind, typ, r.ReplyType())
			}
		}
	}
	for _, s := range samples() {
		r, isReply := reflect.New(reflect.TypeOf(s.full)).Interface().(Reply)
		if !isReply {
			continue
		}
		if !decodeFlat(mustMarshal(t, s.full), r) {
			t.Errorf("%s: decodeFlat declined it", s.kind)
		}
	}
	if _, ok := peekHead(bytes.Repeat([]byte(" "), 3)); ok {
		t.Error("peekHead accepted blank input")
	}
}

func FuzzDecodeAgreesWithCarefulDecode(f *testing.F) {
	for _, c := range headCases {
		f.Add([]byte(c))
	}
	f.Fuzz(checkDecodeAgrees)
}

// BenchmarkDecodeReply compares the one-pass decode of an attempt's result
// with the careful one.
func BenchmarkDecodeReply(b *testing.B) {
	data, err := AttemptResult{GroupID: "0a1b2c3d4e5f-1x", Attempt: 1, WorkerID: "w-1", StatusClass: StatusOK,
		ErrorScope: ScopeNone, HTTPStatus: 200, FinishReason: "length", Content: strings.Repeat("token ", 20),
		Usage: Usage{InputUnits: 12, OutputUnits: 20}, FirstByteMs: ptr(int64(1)), ElapsedMs: 2}.MarshalJSON()
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name   string
		decode func([]byte) (Reply, error)
	}{{"one-pass", DecodeReply}, {"careful", decodeReplyCarefully}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.decode(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
