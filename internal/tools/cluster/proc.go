package cluster

import (
	"bufio"
	"context"
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
	"time"
)

// Part is one process of the cluster as the manifest keeps it: enough to
// stop it, check it is the process it was, and start it again.
type Part struct {
	Name string   `json:"name"`
	Args []string `json:"args"` // Args[0] is the binary
	// Env adds variables; a value "@FILE" is read from FILE (relative to
	// the state directory) when the part starts, so secrets stay in files.
	Env map[string]string `json:"env,omitempty"`
	// Ready is how to tell the part is ready: http://... (a 200),
	// redis://host:port (PONG) or tcp://host:port (a connection).
	Ready string `json:"ready"`
	// Ports are the ports it listens on, checked free after it stops.
	Ports []int `json:"ports"`
	Pid   int   `json:"pid"`
}

// Manifest is what Up started, in start order, and the spec it ran.
type Manifest struct {
	Spec  Spec   `json:"spec"`
	Parts []Part `json:"parts"`
}

// ManifestFile is the manifest's name in the state directory.
const ManifestFile = "cluster.json"

// ReadManifest reads dir's manifest.
func ReadManifest(dir string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", ManifestFile, err)
	}
	return &m, nil
}

func (m *Manifest) write() error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	tmp := filepath.Join(m.Spec.Dir, ManifestFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return os.Rename(tmp, filepath.Join(m.Spec.Dir, ManifestFile))
}

// Part returns the part named name.
func (m *Manifest) Part(name string) (*Part, bool) {
	for i := range m.Parts {
		if m.Parts[i].Name == name {
			return &m.Parts[i], true
		}
	}
	return nil, false
}

// start runs the part in the background: its own process group (a ^C
// to make does not reach it), output to its log, its pid in its pid
// file. exited is closed when the process ends while this process still
// waits for it.
func (p *Part) start(dir string) (exited <-chan struct{}, err error) {
	logPath := LogFile(dir, p.Name)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o700); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	defer log.Close()
	cmd := exec.Command(p.Args[0], p.Args[1:]...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = os.Environ()
	for k, v := range p.Env {
		if f, ok := strings.CutPrefix(v, "@"); ok {
			data, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return nil, fmt.Errorf("cluster: %s: %w", p.Name, err)
			}
			v = strings.TrimSpace(string(data))
		}
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cluster: start %s: %w", p.Name, err)
	}
	p.Pid = cmd.Process.Pid
	if err := os.WriteFile(PidFile(dir, p.Name), []byte(strconv.Itoa(p.Pid)+"\n"), 0o600); err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return done, nil
}

// waitReady polls the part's readiness until it answers, the process
// exits or ctx ends; the error then names the part and quotes its log's
// last lines.
func (p *Part) waitReady(ctx context.Context, dir string, exited <-chan struct{}) error {
	backoff := 20 * time.Millisecond
	for {
		err := probe(ctx, p.Ready)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("cluster: %s exited before it was ready; its log ends:\n%s", p.Name, logTail(dir, p.Name))
		case <-ctx.Done():
			return fmt.Errorf("cluster: %s not ready (%v); its log ends:\n%s", p.Name, err, logTail(dir, p.Name))
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 250*time.Millisecond)
	}
}

// probe checks a readiness address once.
func probe(ctx context.Context, ready string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	switch {
	case strings.HasPrefix(ready, "http://"):
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ready, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		}
		return nil
	case strings.HasPrefix(ready, "redis://"), strings.HasPrefix(ready, "tcp://"):
		host := ready[strings.Index(ready, "://")+3:]
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", host)
		if err != nil {
			return err
		}
		defer c.Close()
		if strings.HasPrefix(ready, "tcp://") {
			return nil
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		if _, err := io.WriteString(c, "PING\r\n"); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		if strings.TrimSpace(line) != "+PONG" {
			return fmt.Errorf("redis answered %q", strings.TrimSpace(line))
		}
		return nil
	}
	return fmt.Errorf("cluster: unknown readiness %q", ready)
}

// logTail is the last lines of a part's log.
func logTail(dir, name string) string {
	data, err := os.ReadFile(LogFile(dir, name))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return "  " + strings.Join(lines[max(0, len(lines)-15):], "\n  ")
}

// alive reports whether pid is a running process started from binary
// (checked on /proc, so a reused pid is never signalled).
func alive(pid int, binary string) bool {
	if pid <= 0 {
		return false
	}
	exe, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe"))
	if err != nil {
		return false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err == nil {
		// A zombie has exited; only its parent has not reaped it yet.
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			return false
		}
	}
	want, err := filepath.EvalSymlinks(binary)
	if err != nil {
		want = binary
	}
	exe = strings.TrimSuffix(exe, " (deleted)")
	return exe == want
}

// Running reports whether the part is running (as the process it started).
func (p *Part) Running() bool { return alive(p.Pid, p.Args[0]) }

// Signal sends sig to the part if it is still the process it started.
func (p *Part) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return fmt.Errorf("cluster: %s is not running", p.Name)
	}
	if err := syscall.Kill(p.Pid, sig); err != nil {
		return fmt.Errorf("cluster: signal %s: %w", p.Name, err)
	}
	return nil
}

// stop ends the part: SIGTERM, then SIGKILL after grace.
func (p *Part) stop(grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	_ = syscall.Kill(p.Pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for p.Running() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // polling another process's exit: no signal reaches a non-parent
	}
	if p.Running() {
		_ = syscall.Kill(p.Pid, syscall.SIGKILL)
		deadline = time.Now().Add(5 * time.Second)
		for p.Running() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if p.Running() {
		return fmt.Errorf("cluster: %s (pid %d) did not stop", p.Name, p.Pid)
	}
	return nil
}

// portsFree waits until none of ports is listened on (a stopped process's
// sockets close as it exits; TIME_WAIT does not hold a listening port).
func portsFree(ports []int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var busy []int
		for _, port := range ports {
			ln, err := net.Listen("tcp", addr(port))
			if err != nil {
				busy = append(busy, port)
				continue
			}
			_ = ln.Close()
		}
		if len(busy) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster: ports still in use: %v", busy)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill sends SIGKILL to the part named name of dir's cluster and waits
// until it is gone.
func Kill(dir, name string) error {
	_, p, err := readPart(dir, name)
	if err != nil {
		return err
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	return p.stop(5 * time.Second)
}

// readPart reads dir's manifest and finds in it the part named name.
func readPart(dir, name string) (*Manifest, *Part, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, nil, err
	}
	p, ok := m.Part(name)
	if !ok {
		return nil, nil, fmt.Errorf("cluster: no part %q", name)
	}
	return m, p, nil
}

// Restart starts the part named name of dir's cluster again (it must not
// be running) and waits until it is ready or ctx ends.
func Restart(ctx context.Context, dir, name string) error {
	m, p, err := readPart(dir, name)
	if err != nil {
		return err
	}
	if p.Running() {
		return fmt.Errorf("cluster: %s is running", name)
	}
	if err := portsFree(p.Ports, 10*time.Second); err != nil {
		return err
	}
	exited, err := p.start(dir)
	if err != nil {
		return err
	}
	if err := m.write(); err != nil {
		return err
	}
	return p.waitReady(ctx, dir, exited)
}

// Down stops every part of dir's cluster, the last started first, and
// checks their ports are free. A cluster that is not up is no error.
func Down(dir string, out io.Writer) error {
	m, err := ReadManifest(dir)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintln(out, "cluster: nothing to stop in", dir)
		return nil
	}
	if err != nil {
		return err
	}
	return m.down(out)
}

// down stops every part, the last started first, and checks their ports
// are free; then the manifest is removed.
func (m *Manifest) down(out io.Writer) error {
	dir := m.Spec.Dir
	var errs []error
	var ports []int
	for _, p := range slices.Backward(m.Parts) {
		if p.Running() {
			fmt.Fprintf(out, "stopping %s (pid %d)\n", p.Name, p.Pid)
		}
		if err := p.stop(15 * time.Second); err != nil {
			errs = append(errs, err)
		}
		_ = os.Remove(PidFile(dir, p.Name))
		ports = append(ports, p.Ports...)
	}
	if err := portsFree(ports, 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		_ = os.Remove(filepath.Join(dir, ManifestFile))
	}
	return errors.Join(errs...)
}

// Up reports whether dir's cluster is up: a manifest whose parts all run.
func IsUp(dir string) bool {
	m, err := ReadManifest(dir)
	if err != nil {
		return false
	}
	for _, p := range m.Parts {
		if !p.Running() {
			return false
		}
	}
	return true
}
