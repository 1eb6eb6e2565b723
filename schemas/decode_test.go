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

// attemptCases are attempt messages, plain and odd, on which DecodeAttempt
// must agree with the careful decode; they also seed
// FuzzDecodeAgreesWithCarefulDecode.
var attemptCases = []string{
	`{"v":1,"group_id":"g","attempt":1,"role":"primary","commit_point":"complete","reply_inbox":"_INBOX.a","request":{"messages":[{"role":"user","content":"hi"}]}}`,
	`{"v":1,"group_id":"g","user_action_id":"ua_1","attempt":2,"role":"hedge","route":"r","operation_class":"chat","model_class":"m","deadline_unix_ms":1700000000000,"remaining_ms":900,"commit_point":"tokens:16","reply_inbox":"_INBOX.b","secret":"s","stall_after_first_token_ms":2000,"folds_first_byte":true,"continuation":{"text":"so far","offset_tokens":5},"request":{"model":"gpt","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}],"name":"n"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"42","tool_call_id":"c"}],"max_tokens":20,"max_tokens_field":"max_completion_tokens","temperature":0.7,"top_p":1,"presence_penalty":-0.5,"frequency_penalty":0,"seed":-3,"stop":["\n","END"],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto","response_format":{"type":"json_object"},"parallel_tool_calls":false,"stream":true,"dialect":"openai","extra":{"user":"u","logit_bias":{"1":-100},"n":1,"metadata":null}}}`,
	` { "v" : 1 , "request" : { "messages" : [ { "role" : "user" , "content" : "hi" } ] , "stop" : [ ] , "extra" : { } } , "commit_point" : "first_token" } `,
	`{"v":1,"request":{"messages":[],"stop":[],"extra":{}}}`,
	`{"v":1,"request":{"messages":null,"stop":null,"extra":null,"temperature":null,"seed":null,"parallel_tool_calls":null,"tools":null,"embedding":null,"model":null,"stream":null},"continuation":null,"commit_point":null,"role":null,"request":null}`,
	`{"v":1,"request":null}`,
	`{"v":1,"continuation":null,"commit_point":null,"role":null,"secret":null,"folds_first_byte":null}`,
	`{"v":1,"request":{"embedding":{"input":["a"],"encoding_format":"float"}}}`,
	`{"v":1,"request":{"messages":[null]}}`,
	`{"v":1,"request":{"stop":[null]}}`,
	`{"v":1,"request":{"stop":["a",1]}}`,
	`{"v":1,"request":{"stop":"a"}}`,
	`{"v":1,"request":{"messages":{}}}`,
	`{"v":1,"request":{"messages":[1]}}`,
	`{"v":1,"request":{"messages":[{"role":1}]}}`,
	`{"v":1,"request":{"messages":[{"role":"user","role":"system"}]}}`,
	`{"v":1,"request":{"messages":[{"Role":"user"}]}}`,
	`{"v":1,"request":{"messages":[{"r\u006fle":"user"}]}}`,
	`{"v":1,"request":{"messages":[{"role":"user","content":"a\u00e9\n","unknown":[1,{"x":null}]}]}}`,
	`{"v":1,"request":{"messages":[{"role":"user","content":"hi"},]}}`,
	`{"v":1,"request":{"messages":[{"role":"user","content":"hi"}}}`,
	`{"v":1,"request":{"messages":[{"role":"user","content":"hi"} {"role":"user"}]}}`,
	`{"v":1,"request":{"temperature":"0.5"}}`,
	`{"v":1,"request":{"temperature":1e400}}`,
	`{"v":1,"request":{"temperature":-0,"top_p":1E-2,"presence_penalty":2.0e0}}`,
	`{"v":1,"request":{"temperature":01}}`,
	`{"v":1,"request":{"seed":1.5}}`,
	`{"v":1,"request":{"seed":9223372036854775808}}`,
	`{"v":1,"request":{"max_tokens":1e2}}`,
	`{"v":1,"request":{"parallel_tool_calls":"true"}}`,
	`{"v":1,"request":{"parallel_tool_calls":true,"stream":false}}`,
	`{"v":1,"request":{"stream":1}}`,
	`{"v":1,"request":{"extra":{"a":1,"a":2}}}`,
	`{"v":1,"request":{"extra":{"\u0061":1}}}`,
	`{"v":1,"request":{"extra":{"user":"u"},"extra":{"n":2}}}`,
	`{"v":1,"request":{"extra":[]}}`,
	`{"v":1,"request":{"extra":{"x":tru}}}`,
	"{\"v\":1,\"request\":{\"extra\":{\"\xff\":1}}}",
	"{\"v\":1,\"request\":{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xc3\xa9 \xff\"}]}}",
	`{"v":1,"request":{"Messages":[]}}`,
	`{"v":1,"request":{"tools":{"weird":true},"tool_choice":7,"response_format":"x"}}`,
	`{"v":1,"request":[]}`,
	`{"v":1,"request":"x"}`,
	`{"v":1,"commit_point":"tokens:0"}`,
	`{"v":1,"commit_point":"sometime"}`,
	`{"v":1,"commit_point":7}`,
	`{"v":1,"commit_point":{"Kind":"complete"}}`,
	`{"v":1,"commit_point":"\u0063omplete"}`,
	`{"v":1,"commit_point":"complete","commit_point":"first_token"}`,
	`{"v":1,"continuation":{"text":"a","text":"b"}}`,
	`{"v":1,"continuation":{"text":7}}`,
	`{"v":1,"continuation":[]}`,
	`{"v":1,"continuation":{}}`,
	`{"v":1,"attempt":"1"}`,
	`{"v":1,"attempt":1.0}`,
	`{"v":1,"deadline_unix_ms":-9223372036854775808,"remaining_ms":9223372036854775807}`,
	`{"v":1,"folds_first_byte":"yes"}`,
	`{"v":1,"group_id":"g","group_id":"h"}`,
	`{"v":1,"Group_ID":"g"}`,
	`{"v":1,"request":{"messages":` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `}}`,
	`{"v":1,"request":{"messages":[{"role":"user","content":` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `}]}}`,
	`{"v":1,"request":{"messages":[{"role":"user","content":"hi"}]}`,
	`{"v":1,"request":{"messages":[{"role":"user","content":"hi"}]}} x`,
	`{"v":2,"request":{"messages":[{"role":"user","content":"hi"}]}}`,
	`{"request":{"messages":[{"role":"user","content":"hi"}]}}`,
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
	gotAtt, gotErr := DecodeAttempt(data)
	var wantAtt Attempt
	wantErr := decodeCarefully(data, &wantAtt)
	if !sameError(gotErr, wantErr) {
		t.Fatalf("DecodeAttempt(%q): error %v, careful decode: %v", data, gotErr, wantErr)
	}
	if gotErr == nil && !reflect.DeepEqual(gotAtt, wantAtt) {
		t.Fatalf("DecodeAttempt(%q) = %+v, careful decode = %+v", data, gotAtt, wantAtt)
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
	for _, c := range append(headCases, attemptCases...) {
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
	for _, s := range samples() {
		if s.kind != KindAttempt {
			continue
		}
		for _, m := range []kinded{s.minimal, s.full} {
			if !decodeFlat(mustMarshal(t, m), new(Attempt)) {
				t.Errorf("decodeFlat declined %s", mustMarshal(t, m))
			}
		}
	}
	if !decodeFlat([]byte(attemptCases[1]), new(Attempt)) {
		t.Errorf("decodeFlat declined %s", attemptCases[1])
	}
	if _, ok := peekHead(bytes.Repeat([]byte(" "), 3)); ok {
		t.Error("peekHead accepted blank input")
	}
}

func FuzzDecodeAgreesWithCarefulDecode(f *testing.F) {
	for _, c := range append(headCases, attemptCases...) {
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

// BenchmarkDecodeAttempt compares the one-pass decode of an attempt, as a
// gateway sends it for a short chat request, with the careful one.
func BenchmarkDecodeAttempt(b *testing.B) {
	data, err := Attempt{GroupID: "0a1b2c3d4e5f-1x", UserActionID: "ua_0a1b2c3d4e5f", Attempt: 1, Role: RolePrimary,
		Route: "fake-a", OperationClass: "chat", ModelClass: "general", DeadlineUnixMs: 1700000000000, RemainingMs: 30000,
		CommitPoint: Complete, ReplyInbox: "_INBOX.abc.0a1b2c3d4e5f.1", Secret: "9f86d081884c7d659a2feaa0c55ad015",
		FoldsFirstByte: true, Request: ChatRequest{Model: "general", MaxTokens: 20,
			Messages: []Message{{Role: MessageUser, Content: TextContent("Say hello")}}}}.MarshalJSON()
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name   string
		decode func([]byte) (Attempt, error)
	}{{"one-pass", DecodeAttempt}, {"careful", func(data []byte) (a Attempt, err error) {
		return a, decodeCarefully(data, &a)
	}}} {
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
