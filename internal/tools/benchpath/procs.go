package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// the kernel exports them at 100 a second on every architecture Go's
// linux ports run on (sysconf(_SC_CLK_TCK)).
const clockTicks = 100

// stopGrace is how long a part has to end after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// proc is one process the run started. Every proc is started in its own
// process group with SIGKILL as its parent-death signal, so it ends with
// the run even when the run itself is killed; stop ends it gracefully.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string // its stdout and stderr
	done chan struct{}
	err  error // Wait's, once done is closed
}

// procs are the run's processes, stopped in reverse order of start.
type procs struct {
	mu   sync.Mutex
	list []*proc
}

// start runs binary with args as part name, its output in dir/name.log.
func (ps *procs) start(dir, name, binary string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s: log: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group: a Ctrl-C at the terminal reaches the run,
	// which stops its parts in order, not every part at once. Pdeathsig:
	// a run that is killed outright takes its parts with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("%s: start %s: %w", name, binary, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	ps.list = append(ps.list, p)
	return p, nil
}

// pid is the process id.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited says whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits up to stopGrace, then SIGKILL.
func (p *proc) stop() error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: SIGTERM: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopGrace):
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: SIGKILL after %v: %w", p.name, stopGrace, err)
	}
	<-p.done
	return fmt.Errorf("%s: still running %v after SIGTERM, killed", p.name, stopGrace)
}

// stopAll stops every process, the last started first, and says which
// did not stop cleanly.
func (ps *procs) stopAll() error {
	ps.mu.Lock()
	list := ps.list
	ps.list = nil
	ps.mu.Unlock()
	var errs []error
	for i := len(list) - 1; i >= 0; i-- {
		errs = append(errs, list[i].stop())
	}
	return errors.Join(errs...)
}

// logTail is the last lines of the process's output, for a failure.
func (p *proc) logTail(lines int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(len(all)-lines, 0):], "\n")
}

// waitReady polls url until it answers 200, the process ends or ctx does.
func (p *proc) waitReady(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("%s: ready probe: %w", p.name, err)
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%v); its log ends:\n%s", p.name, p.err, p.logTail(20))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w; its log ends:\n%s", p.name, url, ctx.Err(), p.logTail(20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before the part listens on it; the part then fails to start,
// and says so.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// cpuTicks reads a process's user and system CPU time, in clock ticks,
// from /proc/<pid>/stat (every thread of it).
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("cpu time of %d: %w", pid, err)
	}
	u, s, err := parseStat(b)
	if err != nil {
		return 0, fmt.Errorf("cpu time of %d: %w", pid, err)
	}
	return u + s, nil
}

// parseStat returns utime and stime, fields 14 and 15 of a
// /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may hold spaces and parentheses itself, so fields are counted from the
// last ')'.
func parseStat(b []byte) (utime, stime int64, err error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, 0, errors.New("stat: no command name in parentheses")
	}
	// After ") ": field 3 (state) is rest[0], so field n is rest[n-3].
	rest := strings.Fields(string(b[end+1:]))
	if len(rest) < 13 {
		return 0, 0, fmt.Errorf("stat: %d fields after the command name, want at least 13", len(rest))
	}
	if utime, err = strconv.ParseInt(rest[14-3], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("stat: utime: %w", err)
	}
	if stime, err = strconv.ParseInt(rest[15-3], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("stat: stime: %w", err)
	}
	return utime, stime, nil
}

// cpuMeter measures the CPU the parts spent over a window.
type cpuMeter struct {
	pids  map[string]int
	start map[string]int64
}

// newCPUMeter starts measuring the named processes (and this one, as
// "bench", the load generator).
func newCPUMeter(pids map[string]int) (*cpuMeter, error) {
	m := &cpuMeter{pids: map[string]int{"bench": os.Getpid()}, start: map[string]int64{}}
	for name, pid := range pids {
		m.pids[name] = pid
	}
	for name, pid := range m.pids {
		t, err := cpuTicks(pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		m.start[name] = t
	}
	return m, nil
}

// spent returns each process's CPU since the meter started.
func (m *cpuMeter) spent() (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for name, pid := range m.pids {
		t, err := cpuTicks(pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = time.Duration(t-m.start[name]) * time.Second / clockTicks
	}
	return out, nil
}
