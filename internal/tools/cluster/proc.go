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

// Procs are the parts a state directory runs, in start order, as its
// manifest file records them. Up's Manifest holds them beside its spec;
// other launchers of local deployments (internal/tools/regions) hold them
// beside theirs, and start, stop, kill and restart them with the same
// methods.
type Procs struct {
	// Dir is the state directory; File the manifest's name in it.
	Dir   string `json:"-"`
	File  string `json:"-"`
	Parts []Part `json:"parts"`
}

// Manifest is what Up started, in start order, and the spec it ran.
type Manifest struct {
	Spec Spec `json:"spec"`
	Procs
}

// ManifestFile is the manifest's name in the state directory.
const ManifestFile = "cluster.json"

// ReadManifest reads dir's manifest.
func ReadManifest(dir string) (*Manifest, error) {
	var m Manifest
	if err := ReadManifestFile(dir, ManifestFile, &m); err != nil {
		return nil, err
	}
	m.Dir, m.File = m.Spec.Dir, ManifestFile
	return &m, nil
}

// ReadProcs reads the parts of the manifest file in dir, whatever else it
// holds.
func ReadProcs(dir, file string) (*Procs, error) {
	ps := &Procs{}
	if err := ReadManifestFile(dir, file, ps); err != nil {
		return nil, err
	}
	ps.Dir, ps.File = dir, file
	return ps, nil
}

// ReadManifestFile reads the JSON manifest file in dir into v (a
// manifest holding Procs).
func ReadManifestFile(dir, file string, v any) error {
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("cluster: %s: %w", file, err)
	}
	return nil
}

// WriteManifest writes v, a manifest holding Procs, as file in dir
// (through a temporary file, so a reader never sees half of it).
func WriteManifest(dir, file string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	tmp := filepath.Join(dir, file+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, file))
}

func (m *Manifest) write() error {
	m.Dir, m.File = m.Spec.Dir, ManifestFile
	return WriteManifest(m.Spec.Dir, ManifestFile, m)
}

// save writes the parts (their pids) into the manifest, keeping what
// else it holds (its spec).
func (ps *Procs) save() error {
	var doc map[string]json.RawMessage
	if err := ReadManifestFile(ps.Dir, ps.File, &doc); err != nil {
		return err
	}
	parts, err := json.Marshal(ps.Parts)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	doc["parts"] = parts
	return WriteManifest(ps.Dir, ps.File, doc)
}

// Part returns the part named name.
func (ps *Procs) Part(name string) (*Part, bool) {
	for i := range ps.Parts {
		if ps.Parts[i].Name == name {
			return &ps.Parts[i], true
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
		_, err := get(ctx, ready, 4096)
		return err
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

// get reads url's body, at most limit bytes; a status other than 200 is
// an error quoting the body.
func get(ctx context.Context, url string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return body, err
}

// GetJSON reads url's JSON answer (a part's monitoring endpoint) into v,
// within 2 s.
func GetJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	body, err := get(ctx, url, 16<<20)
	if err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	return json.Unmarshal(body, v)
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
	ps, err := ReadProcs(dir, ManifestFile)
	if err != nil {
		return err
	}
	return ps.Kill(name)
}

// Kill sends SIGKILL to the part named name and waits until it is gone.
func (ps *Procs) Kill(name string) error {
	p, ok := ps.Part(name)
	if !ok {
		return fmt.Errorf("cluster: no part %q", name)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	return p.stop(5 * time.Second)
}

// Restart starts the part named name of dir's cluster again (it must not
// be running) and waits until it is ready or ctx ends.
func Restart(ctx context.Context, dir, name string) error {
	ps, err := ReadProcs(dir, ManifestFile)
	if err != nil {
		return err
	}
	return ps.Restart(ctx, name)
}

// Restart starts the part named name again (it must not be running),
// records its new pid and waits until it is ready or ctx ends.
func (ps *Procs) Restart(ctx context.Context, name string) error {
	p, ok := ps.Part(name)
	if !ok {
		return fmt.Errorf("cluster: no part %q", name)
	}
	if p.Running() {
		return fmt.Errorf("cluster: %s is running", name)
	}
	if err := portsFree(p.Ports, 10*time.Second); err != nil {
		return err
	}
	exited, err := p.start(ps.Dir)
	if err != nil {
		return err
	}
	if err := ps.save(); err != nil {
		return err
	}
	return p.waitReady(ctx, ps.Dir, exited)
}

// Down stops every part of dir's cluster, the last started first, and
// checks their ports are free. A cluster that is not up is no error.
func Down(dir string, out io.Writer) error {
	return DownProcs(dir, ManifestFile, out)
}

// DownProcs stops every part of the manifest file in dir, as Down does.
func DownProcs(dir, file string, out io.Writer) error {
	ps, err := ReadProcs(dir, file)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintln(out, "nothing to stop in", dir)
		return nil
	}
	if err != nil {
		return err
	}
	return ps.Down(out)
}

// Down stops every part, the last started first, and checks their ports
// are free; then the manifest is removed.
func (ps *Procs) Down(out io.Writer) error {
	var errs []error
	var ports []int
	for _, p := range slices.Backward(ps.Parts) {
		if p.Running() {
			fmt.Fprintf(out, "stopping %s (pid %d)\n", p.Name, p.Pid)
		}
		if err := p.stop(15 * time.Second); err != nil {
			errs = append(errs, err)
		}
		_ = os.Remove(PidFile(ps.Dir, p.Name))
		ports = append(ports, p.Ports...)
	}
	if err := portsFree(ports, 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		_ = os.Remove(filepath.Join(ps.Dir, ps.File))
	}
	return errors.Join(errs...)
}

// IsUp reports whether dir's cluster is up: a manifest whose parts all run.
func IsUp(dir string) bool { return ProcsUp(dir, ManifestFile) }

// ProcsUp reports whether the manifest file in dir names parts that all run.
func ProcsUp(dir, file string) bool {
	ps, err := ReadProcs(dir, file)
	if err != nil {
		return false
	}
	for _, p := range ps.Parts {
		if !p.Running() {
			return false
		}
	}
	return true
}

// Status prints each part of the manifest file in dir and whether it runs;
// an error unless every part runs.
func Status(dir, file string, out io.Writer) error {
	ps, err := ReadProcs(dir, file)
	if err != nil {
		return err
	}
	down := 0
	for _, p := range ps.Parts {
		state := "running"
		if !p.Running() {
			state, down = "down", down+1
		}
		fmt.Fprintf(out, "%-18s %-8s pid %d\n", p.Name, state, p.Pid)
	}
	if down > 0 {
		return fmt.Errorf("%d of %d parts down", down, len(ps.Parts))
	}
	return nil
}

// PortsFree checks that none of ports is listened on.
func PortsFree(ports []int) error { return portsFree(ports, 0) }
