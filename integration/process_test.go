package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/httpdoor"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
)

// processDeadline is the policy deadline of the process tests' groups.
const processDeadline = 4 * time.Second

// processHeartbeatTimeout is the heartbeat_timeout of processConfigYAML.
const processHeartbeatTimeout = 300 * time.Millisecond

// processConfigYAML is the configuration of every process, formatted with
// the NATS URL, the HTTP listen address, the route's base_url and the
// deadline: one route, a, whose base_url names the worker process that calls
// it (the provider tells the workers apart by it), in pool general. Hedging is off and the route
// may be reused, so what replaces a lost attempt is a replacement on route
// a: the queue group's other worker. Heartbeats stop within 300ms of a
// worker's death.
const processConfigYAML = `nats:
  urls: [%[1]s]
  max_payload: 1MiB
http:
  listen: %[2]s
  body_limit: 512KiB
routes:
  - {name: a, provider: openai, base_url: %[3]q, model: m}
pools:
  general:
    routes: [a]
policies:
  default:
    hedge: false
    same_route_hedging: true
    control_fraction: 0
    max_attempts: 3
    deadline: %[4]s
    min_useful_time: 100ms
    accept_timeout: 250ms
    heartbeat_interval: 50ms
    heartbeat_timeout: 300ms
    duplicate_rate: {ceiling: 1}
    guardrail: {enabled: false}
`

// TestKilledWorkerProcessIsReplacedByTheSurvivingWorker runs the hedgerow
// binary as a gateway and two worker processes (one route, one queue group)
// against a nats-server process. The provider holds the first request it
// gets; the worker process that sent it is killed with SIGKILL while it holds
// the attempt. It asserts that the killed worker's provider connection is
// closed, and that the caller gets 200 with the surviving worker's answer
// after at least two attempts — the lost one and its replacement; a third
// only if the replacement was queued to the dead worker before nats-server
// noticed its death — with a committed group record saying the last
// replacement won.
func TestKilledWorkerProcessIsReplacedByTheSurvivingWorker(t *testing.T) {
	sys := startSystem(t, "w1", "w2")
	held := sys.provider.hold(1)
	t.Cleanup(held)
	answer := sys.chatAsync(t)
	victim := sys.waitHeld(t)
	sys.kill(t, victim.caller)
	select {
	case <-victim.gone:
	case <-time.After(10 * time.Second):
		t.Fatalf("the provider connection of killed worker %s was never closed", victim.caller)
	}
	res := <-answer
	survivor := map[string]string{"w1": "w2", "w2": "w1"}[victim.caller]
	if res.err != nil {
		t.Fatalf("chat completion: %v", res.err)
	}
	if res.status != http.StatusOK || res.content != answerFrom(survivor) || res.attempts < 2 {
		t.Fatalf("status %d, content %q, %s %d; want 200 with %q after at least 2 attempts\n%s",
			res.status, res.content, frontdoor.HeaderAttempts, res.attempts, answerFrom(survivor), res.body)
	}
	t.Logf("killed %s holding attempt 1; %s answered through the replacement", victim.caller, survivor)
	rec := sys.records.only(t)
	if rec.Outcome != schemas.GroupCommitted || rec.WinnerRole != schemas.RoleReplacement || rec.WinnerAttempt != rec.Attempts ||
		rec.Attempts != res.attempts {
		t.Fatalf("group record %+v, want committed by the last replacement, as the answer's %d attempts say", rec, res.attempts)
	}
}

// TestGroupFailsCleanlyWhenItsOnlyWorkerProcessIsKilled runs the gateway and
// a single worker process; the worker is killed with SIGKILL while it holds
// the attempt, so nothing can replace it. It asserts that the caller gets, by
// the deadline, a 5xx OpenAI error object whose code is a stable group error
// (all_routes_failed or deadline_exceeded), and a failed group record with
// that code.
func TestGroupFailsCleanlyWhenItsOnlyWorkerProcessIsKilled(t *testing.T) {
	sys := startSystem(t, "w1")
	held := sys.provider.hold(1)
	t.Cleanup(held)
	start := time.Now()
	answer := sys.chatAsync(t)
	victim := sys.waitHeld(t)
	sys.kill(t, victim.caller)
	res := <-answer
	took := time.Since(start)
	if res.err != nil {
		t.Fatalf("chat completion: %v", res.err)
	}
	code := schemas.ErrorCode(res.errorCode)
	stable := code == schemas.ErrAllRoutesFailed || code == schemas.ErrDeadlineExceeded
	if res.status < 500 || !stable {
		t.Fatalf("status %d, error code %q; want a 5xx with all_routes_failed or deadline_exceeded\n%s", res.status, code, res.body)
	}
	t.Logf("killed %s holding attempt 1; answered %d %s after %v", victim.caller, res.status, code, took)
	if took > processDeadline+deadlineSlack {
		t.Fatalf("answered after %v, past the %v deadline", took, processDeadline)
	}
	if rec := sys.records.only(t); rec.Outcome != schemas.GroupFailed || rec.ErrorCode != code {
		t.Fatalf("group record %+v, want failed with %s", rec, code)
	}
}

// TestStreamBrokenAfterCommitEndsWithAnErrorEventWithinTheHeartbeatTimeout
// streams an answer through the gateway and a single worker process. The
// provider sends the first word, which commits the stream (commit point
// first_token) and reaches the caller, then stalls; the worker process is
// killed with SIGKILL. No other attempt may take over after bytes reached
// the caller (docs/architecture.md §4 rule 3), so it asserts that the
// stream ends with an error event and no [DONE], and that it ends within
// the heartbeat timeout (plus 1 s) of the kill, not at the deadline: the
// engine's heartbeat timer stays armed after the first byte (§4 rule 4).
func TestStreamBrokenAfterCommitEndsWithAnErrorEventWithinTheHeartbeatTimeout(t *testing.T) {
	sys := startSystem(t, "w1")
	held := sys.provider.holdMidStream(1)
	t.Cleanup(held)
	client := &http.Client{Timeout: processDeadline + deadlineSlack + 3*time.Second}
	t.Cleanup(client.CloseIdleConnections)
	start := time.Now()
	body := `{"model":"general","messages":[{"role":"user","content":"hello"}],"max_tokens":50,"stream":true}`
	resp, err := client.Post(sys.gateway+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("chat completion: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d %s, want a 200 event stream\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), data)
	}
	events := make(chan string)
	readErr := make(chan error, 1)
	stopReading := make(chan struct{})
	defer close(stopReading) // before the body is closed, which ends the reader
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				select {
				case events <- data:
				case <-stopReading:
					return
				}
			}
		}
		readErr <- sc.Err()
	}()
	// The stream opens with the assistant's role, then the first word.
	var before []string
	for ev := range events {
		before = append(before, ev)
		if strings.Contains(ev, `"content":"answer"`) {
			break
		}
	}
	if len(before) == 0 || !strings.Contains(before[len(before)-1], `"content":"answer"`) {
		t.Fatalf("events %q, want the first word of the answer", before)
	}
	victim := sys.waitHeld(t)
	sys.kill(t, victim.caller)
	killed := time.Now()
	var rest []string
	for ev := range events {
		rest = append(rest, ev)
	}
	took := time.Since(start)
	if err := <-readErr; err != nil {
		t.Fatalf("the stream did not end by itself after %v (%d more events): %v", took, len(rest), err)
	}
	if len(rest) == 0 || !strings.HasPrefix(rest[len(rest)-1], `{"error":`) || slices.Contains(rest, "[DONE]") {
		t.Fatalf("events after the first word %q, want the stream to end with an error event and no [DONE]", rest)
	}
	sinceKill := time.Since(killed)
	t.Logf("killed %s mid-stream; the stream ended %v after the kill (%v after the request) with %s", victim.caller, sinceKill, took, rest[len(rest)-1])
	if last := rest[len(rest)-1]; strings.Contains(last, "deadline_exceeded") {
		t.Fatalf("the stream ended with %s: the deadline, not the lost heartbeats", last)
	}
	if sinceKill > processHeartbeatTimeout+time.Second {
		t.Fatalf("the stream ended %v after the kill, want within the heartbeat timeout %v + 1s", sinceKill, processHeartbeatTimeout)
	}
}

// system is a running set of processes: nats-server, a gateway and worker
// processes, with the provider and a group record subscriber in the test.
type system struct {
	provider *provider
	gateway  string // http://host:port
	workers  map[string]*process
	records  *groupRecordBook
}

// startSystem starts nats-server, one worker process per name (each calls
// the provider under its own base URL) and the gateway, and returns once
// every worker answers the readiness ping and the gateway is ready.
func startSystem(t *testing.T, workerNames ...string) *system {
	t.Helper()
	ps := startProcesses(t, processOptions{workers: workerNames, gateways: 1, firstByte: 10 * time.Millisecond, debug: true})
	return &system{provider: ps.provider, gateway: ps.gateways[0], workers: ps.workers, records: subscribeGroupRecords(t, ps.nc)}
}

// waitReady waits until a gateway is ready (/readyz answers 200) and every
// pool has a live worker (its status endpoint says so): /readyz alone no
// longer waits for workers.
func waitReady(t *testing.T, gateway string) {
	t.Helper()
	eventually.True(t, 15*time.Second, gateway+"/readyz to answer 200 and every pool to have a live worker", func() bool {
		resp, err := http.Get(gateway + "/readyz")
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
		if resp, err = http.Get(gateway + httpdoor.StatusPath); err != nil {
			return false
		}
		defer resp.Body.Close()
		var st struct {
			PoolsWithoutWorkers map[string][]string `json:"pools_without_workers"`
		}
		return json.NewDecoder(resp.Body).Decode(&st) == nil && len(st.PoolsWithoutWorkers) == 0
	})
}

// kill kills a worker process with SIGKILL and reaps it.
func (s *system) kill(t *testing.T, name string) {
	t.Helper()
	w := s.workers[name]
	if w == nil {
		t.Fatalf("the provider was called by %q, which is no worker process", name)
	}
	w.kill(t)
}

// waitHeld waits for the request the provider holds.
func (s *system) waitHeld(t *testing.T) arrival {
	t.Helper()
	select {
	case a := <-s.provider.held:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no attempt reached the provider")
		return arrival{}
	}
}

// chatResult is the gateway's answer to one chat completion.
type chatResult struct {
	status    int
	attempts  int    // the X-Hedgerow-Attempts header; 0 when absent
	content   string // of a 200
	errorCode string // of an error object
	body      []byte
	err       error
}

// chatAsync sends one non-streaming chat completion to the gateway and
// delivers its answer.
func (s *system) chatAsync(t *testing.T) <-chan chatResult {
	t.Helper()
	out := make(chan chatResult, 1)
	client := &http.Client{Timeout: processDeadline + 10*time.Second}
	t.Cleanup(client.CloseIdleConnections)
	go func() {
		var r chatResult
		body := `{"model":"general","messages":[{"role":"user","content":"hello"}],"max_tokens":50}`
		resp, err := client.Post(s.gateway+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			r.err = err
			out <- r
			return
		}
		defer resp.Body.Close()
		r.status = resp.StatusCode
		r.attempts, _ = strconv.Atoi(resp.Header.Get(frontdoor.HeaderAttempts))
		if r.body, r.err = io.ReadAll(resp.Body); r.err != nil {
			out <- r
			return
		}
		var decoded struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(r.body, &decoded); err != nil {
			r.err = fmt.Errorf("status %d, undecodable body %q: %w", r.status, r.body, err)
		}
		if len(decoded.Choices) > 0 {
			r.content = decoded.Choices[0].Message.Content
		}
		if decoded.Error != nil {
			r.errorCode = decoded.Error.Code
		}
		out <- r
	}()
	return out
}

// only waits for the one group record of the test's one group.
func (b *groupRecordBook) only(t *testing.T) schemas.GroupRecord {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		b.mu.Lock()
		var recs []schemas.GroupRecord
		for _, rs := range b.byGroup {
			recs = append(recs, rs...)
		}
		b.mu.Unlock()
		switch {
		case len(recs) == 1:
			return recs[0]
		case len(recs) > 1:
			t.Fatalf("%d group records, want the one of the one group: %+v", len(recs), recs)
		}
		select {
		case <-b.changed:
		case <-timeout:
			t.Fatal("no group record")
		}
	}
}

// process is a child process of the test, its output in a log file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string

	done chan struct{} // closed once the process has ended and is reaped
}

// startProcess starts a child process; the test's cleanup kills and reaps
// it, and prints its log if the test failed.
func startProcess(t *testing.T, dir, name, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, log: filepath.Join(dir, name+".log")}
	out, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close() // the child holds its own descriptor
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.cmd.SysProcAttr = childProcAttr()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p.done = make(chan struct{})
	go func() {
		// Wait's error is "signal: killed", or the exit status of a
		// process that ended early, which its log shows.
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill(t)
		if t.Failed() {
			data, _ := os.ReadFile(p.log)
			t.Logf("%s (%s %s) log:\n%s", name, filepath.Base(bin), strings.Join(args, " "), tail(data, 8<<10))
		}
	})
	return p
}

// kill kills the process with SIGKILL, unless it already ended, and waits
// until it is reaped.
func (p *process) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("kill %s: %v", p.name, err)
	}
	<-p.done
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// dumpStacks asks a live Go process for its goroutines' stacks (SIGQUIT
// makes the runtime write them to its log and exit), so a test that gave up
// on it shows where it was stuck.
func (p *process) dumpStacks(t *testing.T) {
	t.Helper()
	if p.exited() {
		return
	}
	if err := p.cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		return
	}
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

// tail is the last n bytes of data.
func tail(data []byte, n int) []byte {
	if len(data) <= n {
		return data
	}
	i := bytes.IndexByte(data[len(data)-n:], '\n')
	return data[len(data)-n+i+1:]
}

// freeAddr returns a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitNATS connects to the nats-server process once it accepts clients.
func waitNATS(t *testing.T, url string) *nats.Conn {
	t.Helper()
	var nc *nats.Conn
	eventually.True(t, 15*time.Second, "nats-server at "+url+" to accept clients", func() bool {
		var err error
		nc, err = nats.Connect(url, nats.Name("test"))
		return err == nil
	})
	t.Cleanup(nc.Close)
	return nc
}

// workersReadyTimeout bounds the wait for worker processes to answer the
// readiness ping: seconds on an idle machine, a few more on a loaded one.
const workersReadyTimeout = 30 * time.Second

// waitWorkers waits until n worker processes answer the micro service
// ping their readiness is checked with; each registers after subscribing to
// its route's attempts, so then every one of them can take an attempt. A
// watched process that exits fails the test at once; one still silent at
// the bound has its goroutines' stacks written to its log first.
func waitWorkers(t *testing.T, nc *nats.Conn, n int, watch ...*process) {
	t.Helper()
	subject := "$SRV.PING." + schemas.WorkerServiceName
	what := strconv.Itoa(n) + " workers to answer " + subject
	bound := time.Now().Add(workersReadyTimeout)
	eventually.True(t, workersReadyTimeout+10*time.Second, what, func() bool {
		for _, p := range watch {
			if p.exited() {
				t.Fatalf("worker process %s exited before it answered %s (its log follows)", p.name, subject)
			}
		}
		if pingedWorkers(t, nc, subject) >= n {
			return true
		}
		if time.Now().After(bound) {
			for _, p := range watch {
				p.dumpStacks(t)
			}
			t.Fatalf("timed out after %v waiting for %s; a live worker's goroutines are in its log", workersReadyTimeout, what)
		}
		return false
	})
}

// pingedWorkers is how many distinct workers answer one ping within 200ms.
func pingedWorkers(t *testing.T, nc *nats.Conn, subject string) int {
	t.Helper()
	inbox := nats.NewInbox()
	replies := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	window := time.After(200 * time.Millisecond)
	for {
		select {
		case m := <-replies:
			var ping struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(m.Data, &ping) == nil {
				ids[ping.ID] = true
			}
		case <-window:
			return len(ids)
		}
	}
}
