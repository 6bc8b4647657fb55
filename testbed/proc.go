package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Timeouts. A 2-core machine running several test packages at once can take
// many times the idle start-up time (kube-apiserver: about 3 s).
const (
	startTimeout = 2 * time.Minute
	stopGrace    = 10 * time.Second
	pollInterval = 50 * time.Millisecond
	logTailLines = 40
)

// proc is one child process, in its own process group, logging to a file.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited and been reaped
	err     error         // Wait's result, valid once done is closed
}

// startProc starts bin with args, appending its stdout and stderr to logPath.
func startProc(name, bin string, args []string, dir, logPath string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testbed: %s log: %w", name, err)
	}
	defer logf.Close() // the child has its own copy
	fmt.Fprintf(logf, "==== testbed %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	// *os.File: the child writes straight into the file, no copying goroutines.
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true, // own group: signals reach any children it starts
		// If the test binary dies without running its cleanups (a panic, a
		// `go test -timeout` abort, a kill), the kernel kills the child.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testbed: start %s: %w", name, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// childEnv is the test's environment minus variables that would point the
// components at the developer's real clusters or change their behaviour.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "KUBECONFIG" || strings.HasPrefix(k, "CONSUL_") || strings.HasPrefix(k, "ETCD") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop signals the process group with sig, waits up to grace, then kills the
// group. It returns once the process has been reaped.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	pgid := p.cmd.Process.Pid
	if sig != syscall.SIGKILL {
		_ = syscall.Kill(-pgid, sig)
		t := time.NewTimer(grace)
		select {
		case <-p.done:
		case <-t.C:
		}
		t.Stop()
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // also anything left in the group
	<-p.done
}

// exitError describes an early exit, with the log tail.
func (p *proc) exitError() error {
	return fmt.Errorf("testbed: %s exited: %v\n%s", p.name, p.err, logTail(p.logPath))
}

// logTail returns the last lines of a log file, formatted for a failure message.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const max = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(fi.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return fmt.Sprintf("--- last lines of %s ---\n%s\n--- end of %s ---", path, strings.Join(lines, "\n"), path)
}

// waitFor polls ready until it returns nil, the process exits, or the timeout.
func waitFor(p *proc, what string, timeout time.Duration, ready func(ctx context.Context) error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if p.exited() {
			return fmt.Errorf("testbed: waiting for %s: %w", what, p.exitError())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		last = ready(ctx)
		cancel()
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testbed: %s not ready after %v: %v\n%s", what, timeout, last, logTail(p.logPath))
		}
		time.Sleep(pollInterval)
	}
}

// logShowsAddrInUse reports whether the last start attempt logged a bind
// failure, in which case the caller picks new ports and tries again.
func logShowsAddrInUse(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	if i := bytes.LastIndex(b, []byte("==== testbed ")); i >= 0 {
		b = b[i:]
	}
	return bytes.Contains(b, []byte("address already in use"))
}

// Ports handed out by this process stay reserved for its lifetime, so that a
// stopped component's port is not given to another one before it restarts.
var (
	portsMu  sync.Mutex
	reserved = map[int]bool{}
)

// freePorts returns n distinct free 127.0.0.1 ports, picked by listening on
// port 0 and closing. With udp, each port is also free for UDP (serf).
func freePorts(n int, udp bool) ([]int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	var ports []int
	for attempts := 0; len(ports) < n; attempts++ {
		if attempts > 100*n {
			return nil, errors.New("testbed: cannot find free ports on 127.0.0.1")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testbed: free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if udp {
			pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				l.Close()
				continue
			}
			pc.Close()
		}
		l.Close()
		if reserved[port] {
			continue
		}
		reserved[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}

// retryAddrInUse runs start until it succeeds or fails for another reason
// than a busy port: the old listener's port can stay busy for a moment
// after its process died. log is the process's log file.
func retryAddrInUse(log string, start func() error) error {
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = start(); err == nil || !logShowsAddrInUse(log) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
	return err
}

// Eventually polls ok every interval until it holds, and fails t if the
// timeout passes first or if exited closes meanwhile (the process the
// test waits on died, so waiting longer would only hide why).
func Eventually(t testing.TB, exited <-chan struct{}, what string, timeout, interval time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-exited:
			t.Fatalf("estuary exited while waiting for %s", what)
		case <-time.After(interval):
		}
	}
}
