package httpdoor

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// everyMember is a fresh member list with a destination of every type a
// door reads a member into, those schemas.DecodeValue reads and those it
// declines (a struct, a slice of another type).
func everyMember() []member {
	var streamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	}
	return []member{
		{"model", "a string", new(string)},
		{"messages", "an array of message objects", new([]schemas.Message)},
		{"max_tokens", "an integer", new(*int)},
		{"temperature", "a number", new(*float64)},
		{"seed", "an integer", new(*int64)},
		{"stop", "a string or an array of strings", new(json.RawMessage)},
		{"stop_sequences", "a list of strings", new([]string)},
		{"parallel_tool_calls", "a boolean", new(*bool)},
		{"stream", "a boolean", new(bool)},
		{"stream_options", "an object", &streamOptions},
		{"options", "an object", new(map[string]json.RawMessage)},
		{"turns", "a list of turns", new([]turn)},
	}
}

// bodyCases are request bodies, plain and odd, on which readMembers must
// agree with readMembersCarefully; they seed FuzzReadMembersAgreesWithCarefulRead.
var bodyCases = []string{
	chatBody(false, ""),
	chatBody(true, `"stream_options":{"include_usage":true},"stop":["\n","END"],"temperature":0.2,"seed":7,"n":1`),
	`{"model":"general","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}],"name":"n"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],` +
		`"max_tokens":20,"temperature":1e-1,"seed":-3,"stop":"x","stop_sequences":["a","b"],"parallel_tool_calls":false,"stream":true,"options":{"a":[1,{"b":null}],"a":2},"user":"u","turns":[{"role":"user","content":"x"}]}`,
	` { "model" : "general" , "messages" : [ { "role" : "user" , "content" : "hi" } ] , "stop_sequences" : [ ] , "options" : { } } `,
	`{"model":"general","messages":[],"stop_sequences":[],"options":{}}`,
	`{"model":null,"messages":null,"max_tokens":null,"stream":null,"options":null,"turns":null}`,
	`{"model":"a","model":"b"}`,
	`{"model":"a","Model":"b"}`,
	`{"mod\u0065l":"a"}`,
	"{\"model\":\"a\",\"\xff\":1}",
	"{\"model\":\"caf\xc3\xa9 \xff\"}",
	`{"model":"a\u00e9\n"}`,
	`{"model":7}`,
	`{"messages":{}}`,
	`{"messages":[null]}`,
	`{"messages":[1]}`,
	`{"messages":[{"role":1}]}`,
	`{"messages":[{"role":"user","role":"system"}]}`,
	`{"messages":[{"Role":"user","CONTENT":"x"}]}`,
	`{"messages":[{"role":"user","content":"hi","unknown":[1,{"x":null}]}]}`,
	`{"max_tokens":1.5}`,
	`{"max_tokens":1e2}`,
	`{"max_tokens":"5"}`,
	`{"max_tokens":9223372036854775808}`,
	`{"temperature":"0.5"}`,
	`{"temperature":1e400}`,
	`{"temperature":-0}`,
	`{"seed":1.0}`,
	`{"stream":1}`,
	`{"stream":"true"}`,
	`{"parallel_tool_calls":0}`,
	`{"stop_sequences":"END"}`,
	`{"stop_sequences":["END",null]}`,
	`{"stop_sequences":[1]}`,
	`{"options":[]}`,
	`{"options":{"\u0061":1}}`,
	`{"stream_options":{"include_usage":true,"Include_Usage":false}}`,
	`{"stream_options":[]}`,
	`{"turns":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
	`{"turns":{}}`,
	`{"model":"a",}`,
	`{"model":"a"} x`,
	`{"model":"a"`,
	`{"model" "a"}`,
	`{"model":tru}`,
	`{"model":"a","deep":` + strings.Repeat(`[`, 100) + strings.Repeat(`]`, 100) + `}`,
	`{"messages":[{"role":"user","content":` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `}]}`,
	`{}`,
	`[]`,
	`null`,
	`"model"`,
	``,
	`   `,
}

// checkReadMembersAgrees fails t unless readMembers answers body as
// readMembersCarefully does: the same members, values and failure.
func checkReadMembersAgrees(t *testing.T, body []byte) {
	t.Helper()
	wrongType := func(m member) *frontdoor.Failure { return openAIWrongType(m) }
	got, want := everyMember(), everyMember()
	gotFields, gotF := readMembers(body, got, wrongType)
	wantFields, wantF := readMembersCarefully(body, want, wrongType)
	if !reflect.DeepEqual(gotF, wantF) {
		t.Fatalf("readMembers(%q): failure %+v, careful read: %+v", body, gotF, wantF)
	}
	if !reflect.DeepEqual(gotFields, wantFields) {
		t.Fatalf("readMembers(%q) = %q, careful read = %q", body, gotFields, wantFields)
	}
	if gotF != nil {
		return
	}
	for i := range got {
		if g, w := reflect.ValueOf(got[i].dst).Elem().Interface(), reflect.ValueOf(want[i].dst).Elem().Interface(); !reflect.DeepEqual(g, w) {
			t.Fatalf("readMembers(%q): %s = %#v, careful read: %#v", body, got[i].name, g, w)
		}
	}
}

func TestReadMembersInOnePassAgreesWithTheCarefulRead(t *testing.T) {
	for _, c := range bodyCases {
		t.Run(c, func(t *testing.T) { checkReadMembersAgrees(t, []byte(c)) })
	}
}

// TestAPlainChatBodyIsReadInOnePass checks that a chat body as clients
// send it is split and its members decoded without encoding/json.
func TestAPlainChatBodyIsReadInOnePass(t *testing.T) {
	body := []byte(bodyCases[2])
	fields, ok := scanMembers(body)
	if !ok {
		t.Fatalf("scanMembers declined %s", body)
	}
	for _, m := range everyMember() {
		raw, present := fields[m.name]
		switch m.name {
		case "stream_options", "turns":
			continue // decoded by encoding/json
		}
		if !present {
			t.Fatalf("member %s missing from %s", m.name, body)
		}
		if !schemas.DecodeValue(raw, m.dst) {
			t.Errorf("DecodeValue declined %s: %s", m.name, raw)
		}
	}
}

func FuzzReadMembersAgreesWithCarefulRead(f *testing.F) {
	for _, c := range bodyCases {
		f.Add([]byte(c))
	}
	f.Fuzz(checkReadMembersAgrees)
}

// BenchmarkReadChatBody compares the door's read of a short chat body in
// one pass with the careful read.
func BenchmarkReadChatBody(b *testing.B) {
	body := []byte(chatBody(false, `"max_tokens":20`))
	for _, bc := range []struct {
		name string
		read func([]byte, []member, func(member) *frontdoor.Failure) (map[string]json.RawMessage, *frontdoor.Failure)
	}{{"one-pass", readMembers}, {"careful", readMembersCarefully}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, f := bc.read(body, everyMember(), openAIWrongType); f != nil {
					b.Fatal(f)
				}
			}
		})
	}
}
