// Package testbed runs the real components estuary is tested against, as
// child processes of the test binary: etcd + kube-apiserver (StartKube) and a
// Consul agent (StartConsul). Nothing is faked: the binaries are built from
// the Go module proxy by testbed/build.sh (`make testbed`) and cached outside
// the clone, keyed by version.
//
// Every process is started in its own process group with a parent-death
// signal, and killed from t.Cleanup, so nothing outlives the test binary.
// Logs go to files in t.TempDir(); failures quote their tail.
//
// Environment:
//
//	ESTUARY_TESTBED_BIN  directory holding kube-apiserver, etcd and consul
//	                     (overrides the cache layout below)
//	ESTUARY_CACHE        cache root (default $HOME/.cache/estuary); binaries
//	                     live in $ESTUARY_CACHE/testbed/<name>-<version>/<name>
package testbed

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

//go:embed versions.env
var versionsEnv string

var versions = parseVersions(versionsEnv)

// Versions of the components, from testbed/versions.env (which build.sh reads too).
var (
	K8sVersion    = versions["K8S_VERSION"]
	EtcdVersion   = versions["ETCD_VERSION"]
	ConsulVersion = versions["CONSUL_VERSION"]
)

// Environment variables read by this package.
const (
	EnvBinDir = "ESTUARY_TESTBED_BIN"
	EnvCache  = "ESTUARY_CACHE"
)

// binVersion maps each binary to the version it is cached under.
var binVersion = map[string]string{
	"kube-apiserver": K8sVersion,
	"etcd":           EtcdVersion,
	"consul":         ConsulVersion,
}

func parseVersions(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

// CacheDir is where build.sh caches the binaries:
// $ESTUARY_CACHE/testbed, by default $HOME/.cache/estuary/testbed.
func CacheDir() (string, error) {
	root := os.Getenv(EnvCache)
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("testbed: cannot find the cache dir (set %s or HOME): %w", EnvCache, err)
		}
		root = filepath.Join(home, ".cache", "estuary")
	}
	return filepath.Join(root, "testbed"), nil
}

// Bin returns the path of a testbed binary: "kube-apiserver", "etcd" or
// "consul". With ESTUARY_TESTBED_BIN set it looks only in that directory;
// otherwise in the version-keyed cache that build.sh fills. A missing binary
// gives an error telling the user to run `make testbed`.
func Bin(name string) (string, error) {
	version, known := binVersion[name]
	if !known {
		names := make([]string, 0, len(binVersion))
		for n := range binVersion {
			names = append(names, n)
		}
		sort.Strings(names)
		return "", fmt.Errorf("testbed: unknown binary %q (known: %s)", name, strings.Join(names, ", "))
	}
	var path, where string
	if dir := os.Getenv(EnvBinDir); dir != "" {
		path = filepath.Join(dir, name)
		where = fmt.Sprintf("%s=%s", EnvBinDir, dir)
	} else {
		cache, err := CacheDir()
		if err != nil {
			return "", err
		}
		path = filepath.Join(cache, name+"-"+version, name)
		where = "the testbed cache"
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("testbed: %s %s not found at %s (%s): run `make testbed` (bash testbed/build.sh) to build it; the first build takes about 13 minutes, later runs reuse the cache", name, version, path, where)
	case err != nil:
		return "", fmt.Errorf("testbed: %s: %w", name, err)
	case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
		return "", fmt.Errorf("testbed: %s is not an executable file: run `make testbed` (bash testbed/build.sh) to rebuild it", path)
	}
	return path, nil
}
