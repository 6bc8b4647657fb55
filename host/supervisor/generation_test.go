package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/replica"
)

// TestStatusReadersRaceWithApply: readiness and /debug/pluginz read every
// runner while Apply reconfigures, restarts and refuses blocks. Run with
// -race, it fails on any field read outside the runner's lock.
func TestStatusReadersRaceWithApply(t *testing.T) {
	sup, _ := newTestSupervisor(t)
	block := func(port int, env string) *config.File {
		p := selfPlugin(t, "a", "ok", fmt.Sprintf("port = %d\n", port))
		p.Env["ESTUARY_TEST_N"] = env
		return &config.File{Plugins: []*config.Plugin{p, selfPlugin(t, "b", "ok", "")}}
	}
	sup.Apply(block(81, "1"))

	// Each reader has its own goroutine: one that also took the other's
	// locks would be ordered after the writes by them, and hide a race.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, read := range []func(){
		func() { sup.Ready(time.Now()) },
		func() { sup.Statuses() },
	} {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				read()
			}
		})
	}
	applies := []*config.File{
		block(82, "1"),    // reconfigured in place
		block(70000, "1"), // refused
		block(83, "2"),    // restarted: its env changed
		block(84, "2"),
	}
	for _, f := range applies {
		waitStatus(t, sup, "a", "running", func(s Status) bool { return s.State == StateRunning })
		sup.Apply(f)
	}
	waitStatus(t, sup, "a", "the last block running", func(s Status) bool {
		return s.State == StateRunning && s.RunningGeneration == 5
	})
	close(stop)
	wg.Wait()
}

// TestApplyDuringStartIsApplied: a block applied while the plugin is still
// in its start-up Configure is not lost. Once that Configure returns, the
// plugin takes the new block in place, or restarts for it when it cannot.
func TestApplyDuringStartIsApplied(t *testing.T) {
	tests := []struct {
		name    string
		restart bool // the new block changes the plugin's env
	}{
		{name: "reconfigured"},
		{name: "restarted", restart: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sup, store := newTestSupervisor(t)
			dir := t.TempDir()
			entered, release := filepath.Join(dir, "entered"), filepath.Join(dir, "release")
			first := selfPlugin(t, "slow", "ok-blocking", "port = 81\n")
			first.Env["ESTUARY_TEST_ENTERED"] = entered
			first.Env["ESTUARY_TEST_RELEASE"] = release
			sup.Apply(&config.File{Plugins: []*config.Plugin{first}})
			waitFile(t, entered)
			starting := waitStatus(t, sup, "slow", "its pid", func(s Status) bool { return s.PID != 0 })

			second := selfPlugin(t, "slow", "ok-blocking", "port = 82\n")
			second.Env["ESTUARY_TEST_ENTERED"] = entered
			second.Env["ESTUARY_TEST_RELEASE"] = release
			if tt.restart {
				// The restarted process does not wait.
				second.Env["ESTUARY_TEST_RELEASE"] = dir
			}
			if d := sup.Apply(&config.File{Plugins: []*config.Plugin{second}}); d.HasErrors() {
				t.Fatal(d)
			}
			st := waitStatus(t, sup, "slow", "the new block", func(s Status) bool { return s.ConfigGeneration == 2 })
			if st.State != StateStarting || st.RunningGeneration != 0 {
				t.Fatalf("the block was not applied during start-up: %+v", st)
			}
			if err := os.WriteFile(release, nil, 0o600); err != nil {
				t.Fatal(err)
			}

			waitPort(t, store, replica.InstanceKey{Plugin: "slow", Provider: "Test", Cluster: "c1"}, 82)
			st = waitStatus(t, sup, "slow", "the new block running", func(s Status) bool {
				return s.State == StateRunning && s.RunningGeneration == 2
			})
			if restarted := st.PID != starting.PID; restarted != tt.restart {
				t.Errorf("pid %d -> %d: restarted = %v, want %v", starting.PID, st.PID, restarted, tt.restart)
			}
			if st.Failures != 0 || st.Restarts != 0 || st.RejectedGeneration != 0 {
				t.Errorf("status %+v: want no failure, restart or rejection", st)
			}
			checkRunning(t, sup, "slow", `{"port":82}`, true)
		})
	}
}

// TestRejectedReconfigureKeepsTheAcceptedConfig: a block the running
// plugin refuses does not replace its config. Status says so, and when
// the process is killed, it restarts with the block it last accepted.
func TestRejectedReconfigureKeepsTheAcceptedConfig(t *testing.T) {
	sup, store := newTestSupervisor(t)
	key := replica.InstanceKey{Plugin: "a", Provider: "Test", Cluster: "c1"}
	sup.Apply(&config.File{Plugins: []*config.Plugin{selfPlugin(t, "a", "ok", "port = 81\n")}})
	waitPort(t, store, key, 81)
	first := waitStatus(t, sup, "a", "running", func(s Status) bool { return s.State == StateRunning })

	d := sup.Apply(&config.File{Plugins: []*config.Plugin{selfPlugin(t, "a", "ok", "port = 70000\n")}})
	if !d.HasErrors() || !strings.Contains(d.Error(), "not between 1 and 65535") {
		t.Fatalf("Apply of a refused block: %v", d)
	}
	st := waitStatus(t, sup, "a", "the refusal", func(s Status) bool { return s.ConfigGeneration == 2 })
	if st.State != StateRunning || st.RunningGeneration != 1 || st.RejectedGeneration != 2 || !strings.Contains(st.LastError, "not between 1 and 65535") {
		t.Errorf("after the refusal: %+v", st)
	}
	checkRunning(t, sup, "a", `{"port":81}`, false)

	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = waitStatus(t, sup, "a", "a new process running", func(s Status) bool {
		return s.State == StateRunning && s.PID != first.PID
	})
	if st.RunningGeneration != 1 || st.RejectedGeneration != 2 || st.Restarts != 1 {
		t.Errorf("after the restart: %+v", st)
	}
	waitFresh(t, store, key)
	waitPort(t, store, key, 81)
	checkRunning(t, sup, "a", `{"port":81}`, false)
}

// checkRunning checks the block Supervisor.Running reports, for configz.
func checkRunning(t *testing.T, sup *Supervisor, label, wantJSON string, wantLatest bool) {
	t.Helper()
	run, latest := sup.Running(label)
	if run == nil || string(run.ConfigJSON) != wantJSON || latest != wantLatest {
		t.Errorf("Running(%q) = %+v, latest %v; want config %s, latest %v", label, run, latest, wantJSON, wantLatest)
	}
}

// TestDeliberateRestartsAreNotFailures: blocks that take a restart (the
// plugin cannot reconfigure, or its env changed) restart it right away,
// without counting failures or backing off, however many come quickly.
func TestDeliberateRestartsAreNotFailures(t *testing.T) {
	tests := []struct {
		name  string
		block func(t *testing.T, n int) *config.Plugin
	}{
		{"cannot reconfigure", func(t *testing.T, n int) *config.Plugin {
			return selfPlugin(t, "a", "ok-restart", fmt.Sprintf("port = %d\n", 80+n))
		}},
		{"env changed", func(t *testing.T, n int) *config.Plugin {
			p := selfPlugin(t, "a", "ok", fmt.Sprintf("port = %d\n", 80+n))
			p.Env["ESTUARY_TEST_N"] = fmt.Sprint(n)
			return p
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sup, store := newTestSupervisorWith(t, Options{HealthyAfter: time.Hour})
			key := replica.InstanceKey{Plugin: "a", Provider: "Test", Cluster: "c1"}
			sup.Apply(&config.File{Plugins: []*config.Plugin{tt.block(t, 1)}})
			prev := waitStatus(t, sup, "a", "running", func(s Status) bool { return s.State == StateRunning })
			for n := 2; n <= 4; n++ {
				if d := sup.Apply(&config.File{Plugins: []*config.Plugin{tt.block(t, n)}}); d.HasErrors() {
					t.Fatal(d)
				}
				st := waitStatus(t, sup, "a", fmt.Sprintf("block %d running", n), func(s Status) bool {
					return s.State == StateRunning && s.RunningGeneration == uint64(n)
				})
				if st.PID == prev.PID {
					t.Fatalf("block %d: pid %d did not restart", n, st.PID)
				}
				if st.Failures != 0 || st.Restarts != 0 || len(st.Backoffs) != 0 {
					t.Fatalf("block %d: deliberate restarts counted as failures: %+v", n, st)
				}
				waitPort(t, store, key, uint32(80+n))
				prev = st
			}
		})
	}
}

// waitFile waits until path exists.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", path)
}

// waitFresh waits until the instance is served from a live stream.
func waitFresh(t *testing.T, store *replica.Store, key replica.InstanceKey) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if in := store.Instance(key); in != nil && !in.Status().Stale {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s is not served fresh", key)
}
