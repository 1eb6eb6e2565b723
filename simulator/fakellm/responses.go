package fakellm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/hedgerow/hedgerow/schemas"
)

// handleResponses answers POST /v1/responses, OpenAI's Responses API, with
// the same draw a chat completion of the same conversation gets.
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	s.serveChat(w, r, &responsesAPI{})
}

// responsesAPI is OpenAI's Responses API, one per request: its events are
// numbered and its closing events repeat the text. Its answers come from
// the same draw as a chat completion: the instructions are one leading
// system message, string input one user message, message items messages
// (input_text and output_text parts as text parts), function_call items an
// assistant message's tool calls and function_call_output items tool
// messages, so a request whose conversation is the same text and whose cap
// is the same draws the same answer and latency on the same route,
// whichever API asked.
type responsesAPI struct {
	seq  int
	text strings.Builder
}

// responsesRequest is the body of POST /v1/responses: what the fake reads.
// Sampling parameters, tools and the rest are accepted and ignored.
type responsesRequest struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    string          `json:"instructions"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
}

// responsesItem is one input item, as far as the fake reads it.
type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// parse reads a Responses request; the Responses API has no continuation
// style, so a trailing assistant item is part of the conversation on
// every route.
func (*responsesAPI) parse(body []byte, maxOutput int, _ Continuation) (chatParams, error) {
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return chatParams{}, &requestError{code: errCodeInvalidBody,
			message: fmt.Sprintf("We could not parse the JSON body of your request: %v", err)}
	}
	invalid := func(param, format string, args ...any) (chatParams, error) {
		return chatParams{}, &requestError{param: param, code: errCodeInvalidParams, message: fmt.Sprintf(format, args...)}
	}
	if m := req.MaxOutputTokens; m != nil && *m < 1 {
		return invalid("max_output_tokens", "max_output_tokens %d is below 1.", *m)
	}
	var msgs []schemas.Message
	if req.Instructions != "" {
		msgs = append(msgs, schemas.Message{Role: schemas.MessageSystem, Content: schemas.TextContent(req.Instructions)})
	}
	input := bytes.TrimSpace(req.Input)
	var items []responsesItem
	switch {
	case len(input) > 0 && input[0] == '"':
		msgs = append(msgs, schemas.Message{Role: schemas.MessageUser, Content: input})
	case json.Unmarshal(input, &items) != nil || len(items) == 0:
		return invalid("input", "input must be a string or a non-empty array of input items.")
	}
	for i, it := range items {
		if it.Type == "" && it.Role != "" {
			it.Type = "message"
		}
		switch it.Type {
		case "message":
			content, err := responsesContent(it.Content)
			if err != nil {
				return invalid(fmt.Sprintf("input[%d].content", i), "%v", err)
			}
			msgs = append(msgs, schemas.Message{Role: schemas.MessageRole(it.Role), Content: content})
		case "function_call":
			call, _ := json.Marshal([]map[string]any{{"id": it.CallID, "type": "function",
				"function": map[string]string{"name": it.Name, "arguments": it.Arguments}}}) // strings always marshal
			if n := len(msgs); n > 0 && msgs[n-1].Role == schemas.MessageAssistant && len(msgs[n-1].ToolCalls) > 0 {
				prev := msgs[n-1].ToolCalls
				msgs[n-1].ToolCalls = append(append(prev[:len(prev)-1:len(prev)-1], ','), call[1:]...)
			} else {
				msgs = append(msgs, schemas.Message{Role: schemas.MessageAssistant, ToolCalls: call})
			}
		case "function_call_output":
			msgs = append(msgs, schemas.Message{Role: schemas.MessageTool, ToolCallID: it.CallID, Content: it.Output})
		default:
			return invalid(fmt.Sprintf("input[%d].type", i), "Input items of type %q are not supported by this server.", it.Type)
		}
	}
	limit := 0
	if req.MaxOutputTokens != nil {
		limit = *req.MaxOutputTokens
	}
	return newChatParams(req.Model, msgs, limit, maxOutput, req.Stream, false, nil)
}

// responsesContent is a message item's content as the chat API carries it:
// a string as is, input_text and output_text parts as text parts; other
// parts are kept as given, for the key alone.
func responsesContent(raw json.RawMessage) (json.RawMessage, error) {
	return chatContent(raw, "part", "content must be a string or a non-empty array of content parts",
		func(typ string) bool { return typ == "input_text" || typ == "output_text" })
}

func (*responsesAPI) id(requestID uint64, route, number int) string {
	return fmt.Sprintf("resp_%016x-r%d-a%d", requestID, route, number)
}

func (*responsesAPI) writeError(w http.ResponseWriter, status int, typ, code, param, message string) {
	writeError(w, status, typ, code, param, message)
}

// responsesObject is the Responses API's response object.
type responsesObject struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	CreatedAt         int64              `json:"created_at"`
	Status            string             `json:"status"`
	Error             json.RawMessage    `json:"error"`
	IncompleteDetails json.RawMessage    `json:"incomplete_details"`
	Model             string             `json:"model"`
	Output            []responsesItemOut `json:"output"`
	Usage             json.RawMessage    `json:"usage"`
}

// responsesItemOut is an output message item.
type responsesItemOut struct {
	ID      string              `json:"id"`
	Type    string              `json:"type"`
	Status  string              `json:"status"`
	Role    string              `json:"role"`
	Content []responsesTextPart `json:"content"`
}

type responsesTextPart struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

// response is the exchange's response object: in progress with no output
// and no usage, or finished with its text.
func (*responsesAPI) response(ex *exchange, finished bool, text string) responsesObject {
	o := responsesObject{ID: ex.id, Object: "response", CreatedAt: ex.start.Unix(), Status: "in_progress",
		Error: json.RawMessage("null"), IncompleteDetails: json.RawMessage("null"), Model: ex.model,
		Output: []responsesItemOut{}, Usage: json.RawMessage("null")}
	if !finished {
		return o
	}
	o.Status = "completed"
	if ex.finish == "length" {
		o.Status, o.IncompleteDetails = "incomplete", json.RawMessage(`{"reason":"max_output_tokens"}`)
	}
	o.Output = []responsesItemOut{responsesMessage(ex, o.Status, text)}
	in, out := ex.att.Request.InputTokens, ex.att.Request.OutputTokens
	o.Usage = fmt.Appendf(nil, `{"input_tokens":%d,"input_tokens_details":{"cached_tokens":0},"output_tokens":%d,`+
		`"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}`, in, out, in+out)
	return o
}

// responsesMessage is the answer's message item.
func responsesMessage(ex *exchange, status, text string) responsesItemOut {
	return responsesItemOut{ID: "msg_" + strings.TrimPrefix(ex.id, "resp_"), Type: "message", Status: status, Role: "assistant",
		Content: []responsesTextPart{{Type: "output_text", Text: text, Annotations: []any{}}}}
}

func (d *responsesAPI) completion(ex *exchange, text string) any { return d.response(ex, true, text) }

// event appends one event named after its type, numbered in sequence.
func (d *responsesAPI) event(buf *bytes.Buffer, typ string, fields map[string]any) {
	fields["type"], fields["sequence_number"] = typ, d.seq
	d.seq++
	appendEvent(buf, typ, fields)
}

// streamStart sends response.created, response.in_progress and the
// opening of the message item and its text part, as the API does before
// its first token.
func (d *responsesAPI) streamStart(buf *bytes.Buffer, ex *exchange) {
	d.event(buf, "response.created", map[string]any{"response": d.response(ex, false, "")})
	d.event(buf, "response.in_progress", map[string]any{"response": d.response(ex, false, "")})
	item := responsesMessage(ex, "in_progress", "")
	item.Content = []responsesTextPart{}
	d.event(buf, "response.output_item.added", map[string]any{"output_index": 0, "item": item})
	d.event(buf, "response.content_part.added", map[string]any{"item_id": item.ID, "output_index": 0, "content_index": 0,
		"part": responsesTextPart{Type: "output_text", Annotations: []any{}}})
}

func (d *responsesAPI) streamToken(buf *bytes.Buffer, ex *exchange, word string) {
	d.text.WriteString(word)
	d.event(buf, "response.output_text.delta", map[string]any{"item_id": "msg_" + strings.TrimPrefix(ex.id, "resp_"),
		"output_index": 0, "content_index": 0, "delta": word, "logprobs": []any{}})
}

// streamEnd closes the text part and the message item, then sends
// response.completed (response.incomplete when the cap cut the answer)
// with the usage.
// streamError sends an error event, the Responses API's way of failing a
// stream after its 200.
func (d *responsesAPI) streamError(buf *bytes.Buffer, _, code, message string) {
	d.event(buf, "error", map[string]any{"code": code, "message": message, "param": nil})
}

func (d *responsesAPI) streamEnd(buf *bytes.Buffer, ex *exchange) {
	final := d.response(ex, true, d.text.String())
	item := final.Output[0]
	d.event(buf, "response.output_text.done", map[string]any{"item_id": item.ID, "output_index": 0, "content_index": 0,
		"text": d.text.String(), "logprobs": []any{}})
	d.event(buf, "response.content_part.done", map[string]any{"item_id": item.ID, "output_index": 0, "content_index": 0,
		"part": item.Content[0]})
	d.event(buf, "response.output_item.done", map[string]any{"output_index": 0, "item": item})
	typ := "response.completed"
	if final.Status == "incomplete" {
		typ = "response.incomplete"
	}
	d.event(buf, typ, map[string]any{"response": final})
}
