package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/eventually"
)

// walkthroughSection is the README section whose shell blocks are the
// newcomer's first hour, in the order they are run.
const walkthroughSection = "## Run it locally"

// The addresses the README's commands and deploy/examples/local.yaml use:
// serve's HTTP listener and the three simulated routes. The walkthrough
// runs them on free ports of its own instead (the only change it makes).
var (
	readmeServeAddr  = "127.0.0.1:8080"
	readmeRouteAddrs = []string{"127.0.0.1:9101", "127.0.0.1:9102", "127.0.0.1:9103"}
)

// readmeWalkthrough returns the commands of the README's walkthrough
// section: every line of its ```sh blocks, continuation lines joined, in
// order, from its heading to the next heading.
func readmeWalkthrough(t *testing.T, readme string) []string {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n"+walkthroughSection+"\n")
	if !ok {
		t.Fatalf("README has no section %q", walkthroughSection)
	}
	var cmds []string
	var cur strings.Builder
	inFence, isSh := false, false
	for _, line := range strings.Split(section, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case !inFence && strings.HasPrefix(line, "#"):
			return cmds // the next heading ends the section
		case !inFence && strings.HasPrefix(trimmed, "```"):
			inFence, isSh = true, trimmed == "```sh"
		case inFence && trimmed == "```":
			inFence = false
		case !inFence || !isSh || trimmed == "" || strings.HasPrefix(trimmed, "#"):
		default:
			if more, ok := strings.CutSuffix(trimmed, `\`); ok {
				cur.WriteString(strings.TrimSpace(more) + " ")
				continue
			}
			cur.WriteString(trimmed)
			cmds = append(cmds, cur.String())
			cur.Reset()
		}
	}
	return cmds
}

// freeAddr returns a loopback address no listener holds now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// walkthrough runs the README's commands with sh in a directory of its own
// that holds bin/hedgerow (this test binary, running main: runMainEnv) and
// deploy/examples/local.yaml (the example, on the walkthrough's ports).
type walkthrough struct {
	t   *testing.T
	dir string
	env []string
	// addrs replaces each README address by the walkthrough's.
	addrs *strings.Replacer
}

func newWalkthrough(t *testing.T) *walkthrough {
	t.Helper()
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(dir, "bin", "hedgerow")); err != nil {
		t.Fatal(err)
	}
	pairs := []string{readmeServeAddr, freeAddr(t)}
	for _, a := range readmeRouteAddrs {
		pairs = append(pairs, a, freeAddr(t))
	}
	w := &walkthrough{t: t, dir: dir, addrs: strings.NewReplacer(pairs...)}
	example, err := os.ReadFile(filepath.Join("..", "..", "deploy", "examples", "local.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range append([]string{readmeServeAddr}, readmeRouteAddrs...) {
		if !bytes.Contains(example, []byte(a)) {
			t.Fatalf("deploy/examples/local.yaml no longer names %s, which the README's commands use", a)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "deploy", "examples"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "deploy", "examples", "local.yaml"), []byte(w.addrs.Replace(string(example))), 0o644); err != nil {
		t.Fatal(err)
	}
	// A clean serve: its JetStream state (records, the gate's ledger) in
	// a state directory of this walkthrough's own.
	w.env = append(os.Environ(), runMainEnv+"=1", "XDG_STATE_HOME="+filepath.Join(dir, "state"), "HOME="+dir)
	return w
}

// url is the walkthrough's address for a README address.
func (w *walkthrough) url(readmeAddr string) string { return "http://" + w.addrs.Replace(readmeAddr) }

// command is a README command as the walkthrough runs it: by sh, on the
// walkthrough's addresses.
func (w *walkthrough) command(ctx context.Context, line string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "sh", "-c", w.addrs.Replace(line))
	cmd.Dir, cmd.Env = w.dir, w.env
	return cmd
}

// run runs a README command to its end and returns its standard output;
// it fails the test when the command fails.
func (w *walkthrough) run(line string) string {
	w.t.Helper()
	return w.runAllowing(line, func(string) bool { return false })
}

// runAllowing is run, except that a failure whose standard error allowed
// accepts is logged instead.
func (w *walkthrough) runAllowing(line string, allowed func(stderr string) bool) string {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := w.command(ctx, line)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start).Round(time.Millisecond)
	switch {
	case err == nil:
		w.t.Logf("%s: %v", line, took)
	case allowed(stderr.String()):
		w.t.Logf("%s: %v, failed as allowed: %v\n%s", line, took, err, stderr.String())
	default:
		w.t.Fatalf("README command %q failed after %v: %v\nstdout:\n%s\nstderr:\n%s", line, took, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// benchFailed is the line bench ends with when some requests failed.
var benchFailed = regexp.MustCompile(`bench: (\d+) of (\d+) requests failed \((.*)\); the report above`)

// aDeadline is one kind of failure bench names that is a request's 30 s
// running out: the gateway's deadline, or the client's own beside it.
var aDeadline = regexp.MustCompile(`^gateway: \d+ × (HTTP 504 deadline_exceeded|client timeout)$`)

// aFewDeadlines accepts a bench whose only failures are a few deadlines
// (at most one request in 100): the gpt4o workload's rare stalls on a
// machine busier than its cores can outlast a request's 30 s, which says
// nothing of the command as written.
func aFewDeadlines(stderr string) bool {
	m := benchFailed.FindStringSubmatch(stderr)
	if m == nil {
		return false
	}
	for _, kind := range strings.Split(m[3], "; ") {
		if !aDeadline.MatchString(kind) {
			return false
		}
	}
	failed, _ := strconv.Atoi(m[1])
	requests, _ := strconv.Atoi(m[2])
	return failed*100 <= requests
}

// start starts a README command that runs until stopped (a route, serve),
// and stops it gracefully when the test ends, failing the test if it
// does not stop cleanly.
func (w *walkthrough) start(line string) {
	w.t.Helper()
	cmd := w.command(context.Background(), "exec "+line) // the signals go to the command, not to sh
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		w.t.Fatalf("README command %q: %v", line, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	w.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				w.t.Errorf("README command %q ended with %v:\n%s", line, err, out.String())
			}
		case <-time.After(cmdWait + 30*time.Second): // serve's shutdown waits for its groups
			_ = cmd.Process.Kill()
			<-exited
			w.t.Errorf("README command %q did not stop on SIGTERM:\n%s", line, out.String())
		}
	})
}

// ready waits until GET url answers 200.
func (w *walkthrough) ready(url string) {
	w.t.Helper()
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	eventually.True(w.t, cmdWait, url+" answering 200", func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// What kind of command each README line is, by its program and
// subcommand only: a line broken in its flags or values still runs, and
// fails as it would for a reader.
var (
	fakeListen = regexp.MustCompile(`^bin/hedgerow fakellm .*--listen (\S+).* &$`)
	serveCmd   = regexp.MustCompile(`^bin/hedgerow serve `)
	curlCmd    = regexp.MustCompile(`^curl `)
	benchCmd   = regexp.MustCompile(`^(\S+=\S+ )*bin/hedgerow bench `)
	exportCmd  = regexp.MustCompile(`^bin/hedgerow report .*--export (\S+)`)
	reportCmd  = regexp.MustCompile(`^bin/hedgerow report `)
	replayCmd  = regexp.MustCompile(`^bin/hedgerow simulate `)
	checkCmd   = regexp.MustCompile(`^bin/hedgerow config check `)
)

// The README's walkthrough — start three simulated routes and serve with
// deploy/examples/local.yaml, send every curl, load it with bench at the
// README's rate, read the report, export the records and replay them with
// simulate --records --sweep, check the configuration — runs as written
// (on ports of its own) against a clean serve, in order, and every
// command succeeds with what the README says it prints. A command this
// test does not know fails it, so the section cannot gain one unchecked.
func TestREADMEWalkthroughRunsAsWritten(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the README's walkthrough needs curl on PATH (apt-get install curl)")
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeWalkthrough(t, string(readme))
	w := newWalkthrough(t)
	seen := map[string]int{}
	for _, line := range cmds {
		switch {
		case fakeListen.MatchString(line):
			w.start(strings.TrimSuffix(line, " &"))
			w.ready(w.url(fakeListen.FindStringSubmatch(line)[1]) + "/healthz")
			seen["route"]++
		case serveCmd.MatchString(line):
			w.start(line)
			w.ready(w.url(readmeServeAddr) + "/readyz")
			seen["serve"]++
		case curlCmd.MatchString(line):
			out := w.run(line)
			var answer map[string]any
			if err := json.Unmarshal([]byte(out), &answer); err != nil || answer["error"] != nil ||
				(answer["object"] == nil && answer["type"] == nil) {
				t.Fatalf("README command %q answered, not in its API's shape (%v):\n%s", line, err, out)
			}
			seen["curl"]++
		case benchCmd.MatchString(line):
			out := w.runAllowing(line, aFewDeadlines)
			if !strings.Contains(out, "requests/s per target") {
				t.Fatalf("README command %q printed no bench report:\n%s", line, out)
			}
			seen["bench"]++
		case exportCmd.MatchString(line):
			w.run(line)
			data, err := os.ReadFile(filepath.Join(w.dir, exportCmd.FindStringSubmatch(line)[1]))
			if err != nil || !bytes.Contains(data, []byte(`"event":"hedge_group_complete"`)) {
				t.Fatalf("README command %q wrote no group records (%v)", line, err)
			}
			seen["export"]++
		case reportCmd.MatchString(line):
			out := w.run(line)
			if !strings.Contains(out, "default/general/") || !strings.Contains(out, "tail gain") {
				t.Fatalf("README command %q printed no report of the pool general:\n%s", line, out)
			}
			// As the README says of a first run: the gain withheld, with
			// what each arm needs and how to get there sooner.
			for _, want := range []string{"tail gain withheld", "more control groups", "evidence sooner:"} {
				if !strings.Contains(out, want) {
					t.Errorf("README command %q: the report does not say %q, as the README says a first run's does:\n%s", line, want, out)
				}
			}
			seen["report"]++
		case replayCmd.MatchString(line):
			out := w.run(line)
			if !strings.Contains(out, "cohort default/general/") || !strings.Contains(out, "recommended:") {
				t.Fatalf("README command %q printed no frontier of the pool general:\n%s", line, out)
			}
			if !strings.Contains(out, "cohort default/text-embedding-3-small/complete left out") {
				t.Errorf("README command %q does not name the embeddings cohort it leaves out, as the README says:\n%s", line, out)
			}
			seen["simulate --records --sweep"]++
		case checkCmd.MatchString(line):
			w.run(line)
			seen["config check"]++
		default:
			t.Fatalf("README walkthrough command %q: this test does not know how to run and check it", line)
		}
	}
	want := map[string]int{"route": 3, "serve": 1, "curl": 4, "bench": 1, "report": 1, "export": 1,
		"simulate --records --sweep": 1, "config check": 1}
	var missing []string
	for kind, n := range want {
		if seen[kind] < n {
			missing = append(missing, fmt.Sprintf("%s (%d of %d)", kind, seen[kind], n))
		}
	}
	if len(missing) > 0 {
		t.Errorf("the README's walkthrough (%d commands) lacks: %s", len(cmds), strings.Join(missing, ", "))
	}
}

// The walkthrough's extraction reads the section's shell blocks in order,
// joins continuation lines and stops at the next heading.
func TestREADMEWalkthroughExtractionReadsTheSectionsShellBlocksInOrder(t *testing.T) {
	readme := "# x\n\n```sh\nbefore\n```\n" + walkthroughSection + "\n\ntext `inline`\n\n```sh\na one &\n# a comment\n\nb two \\\n  --three\n```\n\n```yaml\n# yaml comment\nc: 1\n```\n\n```sh\nd\n```\n### Next\n\n```sh\nafter\n```\n"
	got := readmeWalkthrough(t, readme)
	want := []string{"a one &", "b two --three", "d"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestTheWalkthroughAllowsABenchOnlyAFewDeadlines(t *testing.T) {
	for _, tc := range []struct {
		stderr string
		want   bool
	}{
		{"hedgerow: bench: 1 of 500 requests failed (gateway: 1 × HTTP 504 deadline_exceeded); the report above has the details", true},
		{"hedgerow: bench: 6 of 500 requests failed (gateway: 6 × HTTP 504 deadline_exceeded); the report above has the details", false},
		{"hedgerow: bench: 1 of 500 requests failed (gateway: 1 × HTTP 503 all_routes_failed); the report above has the details", false},
		{"hedgerow: bench: 3 of 500 requests failed (gateway: 1 × HTTP 504 deadline_exceeded; gateway: 2 × client timeout); the report above has the details", true},
		{"hedgerow: bench: 2 of 500 requests failed (gateway: 1 × HTTP 504 deadline_exceeded; gateway: 1 × HTTP 429 overloaded); the report above has the details", false},
		{"Error: unknown flag: --rat", false},
	} {
		if got := aFewDeadlines(tc.stderr); got != tc.want {
			t.Errorf("aFewDeadlines(%q) = %v, want %v", tc.stderr, got, tc.want)
		}
	}
}
