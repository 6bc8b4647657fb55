package deploy

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// testVersion is the version the tests build the image with: `estuary
// version` must print it, so the build flags reached the binary.
const testVersion = "0.0.0-imagetest"

// ociImage is the image `make image` builds, read back from its tarball.
type ociImage struct {
	tarball      string
	config       imageConfig
	configDigest string
	entries      map[string]*tar.Header // the layer's files, by path without a leading "/"
	rootfs       string                 // the layer unpacked
}

// imageConfig is the part of an OCI image config the tests read.
type imageConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		User         string              `json:"User"`
		Entrypoint   []string            `json:"Entrypoint"`
		Cmd          []string            `json:"Cmd"`
		WorkingDir   string              `json:"WorkingDir"`
		ExposedPorts map[string]struct{} `json:"ExposedPorts"`
		Env          []string            `json:"Env"`
	} `json:"config"`
}

var imageOnce = sync.OnceValues(buildImage)

// image builds the image with deploy/image.sh (what `make image` runs) once
// per test run, and unpacks it.
func image(t testing.TB) *ociImage {
	t.Helper()
	tool(t, "crane") // built here, so its build is reported once
	img, err := imageOnce()
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func buildImage() (*ociImage, error) {
	img := &ociImage{tarball: filepath.Join(scratch, "image", "estuary.tar"), rootfs: filepath.Join(scratch, "rootfs")}
	cmd := exec.Command("bash", "image.sh", img.tarball)
	cmd.Env = append(os.Environ(), "VERSION="+testVersion)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("deploy/image.sh: %w\n%s", err, out)
	}
	if err := img.read(); err != nil {
		return nil, fmt.Errorf("%s: %w", img.tarball, err)
	}
	return img, nil
}

// read checks the OCI layout (index, manifest, config and layer, each
// against its digest), unpacks the one layer into rootfs and records its
// entries.
func (img *ociImage) read() error {
	blobs := map[string][]byte{}
	var index, dockerManifest []byte
	f, err := os.Open(img.tarball)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		name := path.Clean(h.Name)
		switch {
		case name == "index.json":
			index = b
		case name == "manifest.json":
			dockerManifest = b
		case strings.HasPrefix(name, "blobs/sha256/"):
			blobs["sha256:"+path.Base(name)] = b
		}
	}
	blob := func(digest, want string) ([]byte, error) {
		b, ok := blobs[digest]
		if !ok {
			return nil, fmt.Errorf("no blob %s (%s)", digest, want)
		}
		if sum := sha256.Sum256(b); "sha256:"+hex.EncodeToString(sum[:]) != digest {
			return nil, fmt.Errorf("blob %s does not match its digest", digest)
		}
		return b, nil
	}
	type descriptor struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
	}
	var idx struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(index, &idx); err != nil {
		return fmt.Errorf("index.json: %w", err)
	}
	if len(idx.Manifests) != 1 || idx.Manifests[0].MediaType != "application/vnd.oci.image.manifest.v1+json" {
		return fmt.Errorf("index.json: want one OCI image manifest, have %+v", idx.Manifests)
	}
	mb, err := blob(idx.Manifests[0].Digest, "manifest")
	if err != nil {
		return err
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(mb, &manifest); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	cb, err := blob(manifest.Config.Digest, "config")
	if err != nil {
		return err
	}
	img.configDigest = manifest.Config.Digest
	if err := json.Unmarshal(cb, &img.config); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if len(manifest.Layers) != 1 {
		return fmt.Errorf("want one layer on an empty base, have %d", len(manifest.Layers))
	}
	lb, err := blob(manifest.Layers[0].Digest, "layer")
	if err != nil {
		return err
	}
	// The Docker archive's manifest.json names the same blobs, so `crane
	// push` and `docker load` read the same image from the tarball.
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(dockerManifest, &docker); err != nil {
		return fmt.Errorf("manifest.json: %w", err)
	}
	blobPath := func(digest string) string { return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:") }
	if len(docker) != 1 || docker[0].Config != blobPath(manifest.Config.Digest) ||
		!slices.Equal(docker[0].Layers, []string{blobPath(manifest.Layers[0].Digest)}) ||
		!slices.Equal(docker[0].RepoTags, []string{"estuary:" + testVersion}) {
		return fmt.Errorf("manifest.json %s does not name the OCI manifest's blobs %s, %s and the tag estuary:%s",
			dockerManifest, manifest.Config.Digest, manifest.Layers[0].Digest, testVersion)
	}
	var layer io.Reader = strings.NewReader(string(lb))
	if strings.HasSuffix(manifest.Layers[0].MediaType, "+gzip") {
		if layer, err = gzip.NewReader(layer); err != nil {
			return err
		}
	}
	return img.unpack(layer)
}

func (img *ociImage) unpack(layer io.Reader) error {
	img.entries = map[string]*tar.Header{}
	tr := tar.NewReader(layer)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if name == "" {
			continue
		}
		img.entries[name] = h
		dst := filepath.Join(img.rootfs, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(dst, os.FileMode(h.Mode).Perm()|modeBits(h.Mode)); err != nil {
				return err
			}
		case tar.TypeReg:
			out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode).Perm())
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("layer entry %s: type %q; the image holds only files and directories", h.Name, h.Typeflag)
		}
	}
}

// modeBits keeps the sticky bit of a tar mode (/tmp's 1777).
func modeBits(mode int64) os.FileMode {
	if mode&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}

// TestImage: the image `make image` builds runs estuary as a non-root
// user from a static binary, with nothing else to execute in it.
func TestImage(t *testing.T) {
	img := image(t)
	c := img.config

	if c.OS != "linux" || c.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", c.OS, c.Architecture, runtime.GOARCH)
	}
	if want := []string{"/usr/local/bin/estuary"}; !slices.Equal(c.Config.Entrypoint, want) {
		t.Errorf("entrypoint %q, want %q", c.Config.Entrypoint, want)
	}
	if want := []string{"run", "-config", "/etc/estuary/plugins.hcl"}; !slices.Equal(c.Config.Cmd, want) {
		t.Errorf("cmd %q, want %q", c.Config.Cmd, want)
	}

	t.Run("non-root user", func(t *testing.T) {
		// A numeric user, so the kubelet can check runAsNonRoot without
		// reading /etc/passwd, and one /etc/passwd names as nonroot.
		uid, gid, ok := strings.Cut(c.Config.User, ":")
		if !ok || uid != "65532" || gid != "65532" {
			t.Fatalf("user %q, want 65532:65532", c.Config.User)
		}
		passwd, err := os.ReadFile(filepath.Join(img.rootfs, "etc/passwd"))
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^nonroot:x:65532:65532:`).Match(passwd) {
			t.Errorf("/etc/passwd names no nonroot user 65532:\n%s", passwd)
		}
	})

	t.Run("no shell", func(t *testing.T) {
		// Only one executable, estuary: no shell, no package manager, no
		// setuid binary to escalate through.
		var executables []string
		for name, h := range img.entries {
			if h.Typeflag == tar.TypeReg && h.Mode&0o111 != 0 {
				executables = append(executables, name)
			}
			if h.Mode&(0o4000|0o2000) != 0 {
				t.Errorf("%s is setuid or setgid (%o)", name, h.Mode)
			}
		}
		if !slices.Equal(executables, []string{"usr/local/bin/estuary"}) {
			t.Errorf("executables %q, want only usr/local/bin/estuary", executables)
		}
		for _, sh := range []string{"bin/sh", "bin/bash", "bin/busybox", "usr/bin/sh", "bin"} {
			if _, ok := img.entries[sh]; ok {
				t.Errorf("the image holds /%s", sh)
			}
		}
	})

	t.Run("binary", func(t *testing.T) {
		h := img.entries["usr/local/bin/estuary"]
		if h == nil {
			t.Fatal("no /usr/local/bin/estuary")
		}
		// Owned by root and not writable by the user it runs as: estuary
		// re-executes this file for its bundled plugins.
		if h.Uid != 0 || h.Gid != 0 || h.Mode&0o022 != 0 {
			t.Errorf("/usr/local/bin/estuary: uid %d gid %d mode %o, want root's, not group or world writable", h.Uid, h.Gid, h.Mode)
		}
		// CGO_ENABLED=0: no interpreter, no shared library to load from an
		// image that has none.
		f, err := elf.Open(filepath.Join(img.rootfs, "usr/local/bin/estuary"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("estuary is dynamically linked (program header %v)", p.Type)
			}
		}
	})

	t.Run("tmp", func(t *testing.T) {
		// go-plugin puts its sockets in $TMPDIR; the chart mounts an
		// emptyDir there, and a plain `docker run` uses this one.
		h := img.entries["tmp"]
		if h == nil || h.Typeflag != tar.TypeDir || h.Mode&0o1777 != 0o1777 {
			t.Errorf("/tmp: %+v, want a directory with mode 1777", h)
		}
	})

	t.Run("version", func(t *testing.T) {
		out := img.exec(t, "version")
		if got := strings.TrimSpace(string(out)); got != testVersion {
			t.Errorf("estuary version printed %q, want %q", got, testVersion)
		}
	})

	t.Run("validate", func(t *testing.T) {
		sample, err := os.ReadFile("../plugins.hcl")
		if err != nil {
			t.Fatal(err)
		}
		img.writeFile(t, "etc/estuary/plugins.hcl", sample)
		img.exec(t, "validate", "-config", "/etc/estuary/plugins.hcl")

		// And it does check: a bad attribute is refused at its position.
		img.writeFile(t, "etc/estuary/bad.hcl", []byte("xds {\n  listen = \"nowhere\"\n}\n"))
		out, err := img.command("validate", "-config", "/etc/estuary/bad.hcl").CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || !strings.Contains(string(out), "bad.hcl:2:") {
			t.Errorf("validate of a bad file: %v\n%s\nwant a failure at bad.hcl:2", err, out)
		}
	})
}

// TestImagePushes: `crane push` takes the tarball as it is (the README's
// way to a registry), here to crane's own registry on loopback, and the
// registry then serves the same image config.
func TestImagePushes(t *testing.T) {
	img := image(t)
	crane := tool(t, "crane")
	reg := exec.Command(crane, "registry", "serve", "--address", "127.0.0.1:0")
	stderr, err := reg.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = reg.Process.Kill()
		_ = reg.Wait()
	})
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := regexp.MustCompile(`serving on port (\d+)`).FindStringSubmatch(sc.Text()); m != nil {
				port <- m[1]
			}
		}
		close(port)
	}()
	p, ok := <-port
	if !ok {
		t.Fatal("crane registry serve ended without serving")
	}
	ref := "127.0.0.1:" + p + "/mesh/estuary:" + testVersion
	run(t, crane, "push", img.tarball, ref)
	cfg := run(t, crane, "config", ref)
	if sum := sha256.Sum256(cfg); "sha256:"+hex.EncodeToString(sum[:]) != img.configDigest {
		t.Errorf("the registry serves config %s, want the image's %s", cfg, img.configDigest)
	}
}

// writeFile writes a file into the unpacked image, readable by its user.
func (img *ociImage) writeFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(img.rootfs, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	return p
}

// command runs the image's entrypoint with args the way a container
// would, as far as a test can: as root (CI), chrooted into the image's
// files as the image's user, so only what the image holds is there;
// otherwise the binary from the layer, with paths under / read from the
// unpacked image.
func (img *ociImage) command(args ...string) *exec.Cmd {
	bin := filepath.Join(img.rootfs, "usr/local/bin/estuary")
	if os.Geteuid() != 0 {
		for i, a := range args {
			if strings.HasPrefix(a, "/etc/estuary/") {
				args[i] = filepath.Join(img.rootfs, a)
			}
		}
		return exec.Command(bin, args...)
	}
	// Not exec.Command: the entrypoint is a path inside the chroot.
	entry := img.config.Config.Entrypoint[0]
	cmd := &exec.Cmd{Path: entry, Args: append([]string{entry}, args...), Dir: "/", Env: []string{}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: img.rootfs, Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
	return cmd
}

func (img *ociImage) exec(t testing.TB, args ...string) []byte {
	t.Helper()
	out, err := img.command(args...).CombinedOutput()
	if err != nil {
		t.Fatalf("estuary %s in the image: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestDockerfileMatchesImage: deploy/Dockerfile, for builders with a
// Docker daemon, describes the image `make image` builds: the same
// entrypoint, command, user, ports and build flags, a static build, a
// distroless or empty base, and every local module the build needs.
func TestDockerfileMatchesImage(t *testing.T) {
	img := image(t)
	stages := dockerfileStages(t, "Dockerfile")
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stages, want a build stage and a final one", len(stages))
	}
	final := stages[len(stages)-1]
	if base := final.from; base != "scratch" && !strings.HasPrefix(base, "gcr.io/distroless/static") {
		t.Errorf("final stage FROM %s, want scratch or gcr.io/distroless/static", base)
	}
	if got := final.last("USER"); got != img.config.Config.User {
		t.Errorf("Dockerfile USER %q, image %q", got, img.config.Config.User)
	}
	if got := final.jsonArgs(t, "ENTRYPOINT"); !slices.Equal(got, img.config.Config.Entrypoint) {
		t.Errorf("Dockerfile ENTRYPOINT %q, image %q", got, img.config.Config.Entrypoint)
	}
	if got := final.jsonArgs(t, "CMD"); !slices.Equal(got, img.config.Config.Cmd) {
		t.Errorf("Dockerfile CMD %q, image %q", got, img.config.Config.Cmd)
	}
	var ports []string
	for p := range img.config.Config.ExposedPorts {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	if got := strings.Fields(final.last("EXPOSE")); !slices.Equal(got, ports) {
		t.Errorf("Dockerfile EXPOSE %q, image %q", got, ports)
	}
	if !strings.Contains(final.last("COPY"), "/usr/local/bin/estuary") {
		t.Errorf("final stage copies %q, want the binary to /usr/local/bin/estuary", final.last("COPY"))
	}

	script, err := os.ReadFile("image.sh")
	if err != nil {
		t.Fatal(err)
	}
	var build string
	for _, s := range stages[:len(stages)-1] {
		for _, in := range s.instructions {
			if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
				build = in.args
			}
		}
	}
	for _, flag := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w -X main.Version=`, "./host/cmd/estuary"} {
		if !strings.Contains(build, flag) {
			t.Errorf("Dockerfile's go build lacks %s: %s", flag, build)
		}
		if !strings.Contains(string(script), flag) {
			t.Errorf("image.sh's go build lacks %s", flag)
		}
	}

	// The root module replaces sdk and proto with local directories; a
	// build stage that does not copy their go.mod before `go mod download`
	// fails there.
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	copies := ""
	for _, in := range stages[0].instructions {
		if in.cmd == "COPY" {
			copies += in.args + "\n"
		}
	}
	for _, m := range regexp.MustCompile(`(?m)^replace \S+ => \./(\S+)$`).FindAllStringSubmatch(string(gomod), -1) {
		if !strings.Contains(copies, m[1]+"/go.mod") {
			t.Errorf("Dockerfile copies no %s/go.mod, which go.mod replaces a module with", m[1])
		}
	}
}

type dockerInstruction struct{ cmd, args string }

type dockerStage struct {
	from         string
	instructions []dockerInstruction
}

func (s dockerStage) last(cmd string) string {
	for i := len(s.instructions) - 1; i >= 0; i-- {
		if s.instructions[i].cmd == cmd {
			return s.instructions[i].args
		}
	}
	return ""
}

func (s dockerStage) jsonArgs(t testing.TB, cmd string) []string {
	t.Helper()
	var args []string
	if err := json.Unmarshal([]byte(s.last(cmd)), &args); err != nil {
		t.Errorf("Dockerfile %s %s: want the exec (JSON) form: %v", cmd, s.last(cmd), err)
	}
	return args
}

// dockerfileStages reads a Dockerfile's instructions by stage: comments
// dropped, continuation lines joined.
func dockerfileStages(t testing.TB, name string) []dockerStage {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages []dockerStage
	var line string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || (l == "" && line == "") {
			continue
		}
		if rest, ok := strings.CutSuffix(l, `\`); ok {
			line += rest + " "
			continue
		}
		line += l
		cmd, args, _ := strings.Cut(line, " ")
		line = ""
		cmd, args = strings.ToUpper(cmd), strings.TrimSpace(args)
		if cmd == "FROM" {
			stages = append(stages, dockerStage{from: strings.Fields(args)[0]})
			continue
		}
		if len(stages) == 0 {
			t.Fatalf("%s: %s before FROM", name, cmd)
		}
		s := &stages[len(stages)-1]
		s.instructions = append(s.instructions, dockerInstruction{cmd, args})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return stages
}
