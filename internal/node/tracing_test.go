package node

import (
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/hedgerow/hedgerow/internal/natstest"
)

// otlpReceiver is a collector's OTLP/HTTP traces endpoint: it decodes what
// the exporter sends with the protocol's own types.
type otlpReceiver struct {
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string // each batch's service.name/service.version
	bad      []string
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	var msg coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &msg)
	}
	if err != nil || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" ||
		req.Header.Get("X-Collector-Key") != "test" {
		r.bad = append(r.bad, req.URL.Path+" "+req.Header.Get("Content-Type")+" (key header set: "+
			strconv.FormatBool(req.Header.Get("X-Collector-Key") != "")+")")
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	for _, rs := range msg.ResourceSpans {
		var name, version string
		for _, kv := range rs.GetResource().GetAttributes() {
			switch kv.Key {
			case "service.name":
				name = kv.Value.GetStringValue()
			case "service.version":
				version = kv.Value.GetStringValue()
			}
		}
		r.services = append(r.services, name+"/"+version)
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func attrOf(s *tracepb.Span, key string) *commonpb.AnyValue {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// TestAGatewayExportsAGroupsTraceOverOTLPInTheCallersTrace runs a gateway
// with tracing.endpoint on a real NATS server with workers and two fake
// providers; a chat naming a traceparent becomes, at the collector, a span
// of the caller's trace with a child per attempt carrying the GenAI
// attributes, and no span carries the prompt or the answer.
func TestAGatewayExportsAGroupsTraceOverOTLPInTheCallersTrace(t *testing.T) {
	collector := &otlpReceiver{}
	srv := httptest.NewServer(collector)
	defer srv.Close()
	t.Setenv("HEDGEROW_TEST_OTLP_HEADERS", "x-collector-key=test")
	cfg := parse(t, fakeRoute(t, 0), fakeRoute(t, 1),
		"tracing: {endpoint: "+srv.URL+"/v1/traces, headers_env: HEDGEROW_TEST_OTLP_HEADERS}\n")
	bus := natstest.Start(t, natstest.MaxPayload(16<<20))
	w, err := StartWorkers(cfg, natstest.Connect(t, bus, nats.Name("worker")), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, w)
	g, err := StartGateway(cfg, natstest.Connect(t, bus, nats.Name("gateway")), nil, Options{Version: "v9.9.9-test"})
	if err != nil {
		t.Fatal(err)
	}
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	const prompt = "the secret plan is tangerine"
	req, err := http.NewRequest(http.MethodPost, "http://"+g.Addr().String()+"/v1/chat/completions",
		strings.NewReader(`{"model":"general","messages":[{"role":"user","content":"`+prompt+`"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	code, answer := do(t, req)
	if code != http.StatusOK {
		t.Fatalf("chat: %d %s", code, answer)
	}
	var chat struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(answer, &chat); err != nil || len(chat.Choices) != 1 {
		t.Fatalf("answer %s: %v", answer, err)
	}
	content := chat.Choices[0].Message.Content
	stop(t, g) // sends what the batch holds

	collector.mu.Lock()
	defer collector.mu.Unlock()
	if len(collector.bad) > 0 {
		t.Fatalf("the collector refused exports: %q", collector.bad)
	}
	for _, svc := range collector.services {
		if svc != "hedgerow-gateway/v9.9.9-test" {
			t.Fatalf("spans of service %q, want hedgerow-gateway/v9.9.9-test (service.name/service.version)", svc)
		}
	}
	var group *tracepb.Span
	children := 0
	for _, s := range collector.spans {
		if hex.EncodeToString(s.TraceId) != callerTrace {
			t.Fatalf("span %q in trace %x, want the caller's", s.Name, s.TraceId)
		}
		if hex.EncodeToString(s.ParentSpanId) == callerSpan {
			group = s
		}
		for _, kv := range s.Attributes {
			if v := kv.Value.GetStringValue(); strings.Contains(v, "tangerine") || (content != "" && strings.Contains(v, content)) {
				t.Fatalf("span %q attribute %s carries the prompt or the answer", s.Name, kv.Key)
			}
		}
	}
	if group == nil || group.Name != "chat general" {
		t.Fatalf("no group span under the caller's span among %d spans", len(collector.spans))
	}
	for _, s := range collector.spans {
		if string(s.ParentSpanId) != string(group.SpanId) {
			continue
		}
		children++
		if m := attrOf(s, "gen_ai.request.model"); m.GetStringValue() != "m" {
			t.Errorf("attempt span %q: gen_ai.request.model %v, want the route's model", s.Name, m)
		}
		if p := attrOf(s, "gen_ai.provider.name"); p.GetStringValue() != "openai" {
			t.Errorf("attempt span %q: gen_ai.provider.name %v", s.Name, p)
		}
	}
	if out := attrOf(group, "gen_ai.usage.output_tokens"); children < 1 || out.GetIntValue() <= 0 {
		t.Fatalf("group span: %d attempt children, output tokens %v; want at least one child and the usage", children, out)
	}
}
