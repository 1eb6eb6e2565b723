package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// cmdWait bounds every wait for a command to start, answer or stop.
const cmdWait = 10 * time.Second

// runningCmd is a long-running subcommand executed in-process, its output
// read line by line.
type runningCmd struct {
	t      *testing.T
	lines  chan string
	done   chan error
	cancel context.CancelFunc
}

// startCmd runs the root command with args until stop cancels its context,
// which the command treats like SIGTERM.
func startCmd(t *testing.T, args ...string) *runningCmd {
	t.Helper()
	root := newRootCmd()
	pr, pw := io.Pipe()
	root.SetOut(pw)
	root.SetErr(pw)
	root.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningCmd{t: t, lines: make(chan string, 1024), done: make(chan error, 1), cancel: cancel}
	go func() {
		err := root.ExecuteContext(ctx)
		_ = pw.Close()
		r.done <- err
	}()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	return r
}

// startProcess runs hedgerow with args as a process of its own (this test
// binary, running main: runMainEnv), its output read line by line; stop
// sends it SIGTERM and returns how it exited. The test's end kills it if it
// still runs.
func startProcess(t *testing.T, args ...string) (*runningCmd, *os.Process) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("start hedgerow %s: %v", strings.Join(args, " "), err)
	}
	r := &runningCmd{t: t, lines: make(chan string, 1024), done: make(chan error, 1), cancel: func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}}
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait() // returns once the output is copied, all of it read below
		_ = pw.Close()
		r.done <- err
		close(exited)
	}()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			go func() {
				for range r.lines { // drain, so the copy to the pipe ends
				}
			}()
			<-exited
		}
	})
	return r, cmd.Process
}

// waitFor returns the first output line matching re's first group.
func (r *runningCmd) waitFor(re *regexp.Regexp) string {
	r.t.Helper()
	timeout := time.After(cmdWait)
	var seen []string
	for {
		select {
		case line, ok := <-r.lines:
			if !ok {
				r.t.Fatalf("command ended without printing %s; output:\n%s\nerr: %v", re, strings.Join(seen, "\n"), <-r.done)
			}
			seen = append(seen, line)
			if m := re.FindStringSubmatch(line); m != nil {
				return m[1]
			}
		case <-timeout:
			r.t.Fatalf("no line matching %s; output:\n%s", re, strings.Join(seen, "\n"))
		}
	}
}

// stop cancels the command's context and returns its error.
func (r *runningCmd) stop() error {
	r.t.Helper()
	r.cancel()
	go func() {
		for range r.lines { // drain, so the command never blocks on its log
		}
	}()
	select {
	case err := <-r.done:
		return err
	case <-time.After(cmdWait):
		r.t.Fatal("command did not stop")
		return nil
	}
}

var servingURL = regexp.MustCompile(`http=(http://\S+)`)

// getBody fetches url with a client that keeps no connection open.
func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: cmdWait, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// noLeaks checks, when the test ends, that the test left no goroutine
// behind. The signal package's loop, started once per process by
// signal.NotifyContext, is not a leak.
func noLeaks(t *testing.T) {
	opts := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("os/signal.signal_recv"),
		goleak.IgnoreTopFunction("os/signal.loop")}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}
