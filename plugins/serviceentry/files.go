package serviceentry

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"

	"github.com/estuary-mesh/estuary/sdk"
)

// Timing of the directory watch: events are coalesced until the directory
// has been quiet for fileSettle, but for no longer than fileMaxSettle; the
// whole directory is also rescanned every fileResync, to recover from lost
// events and from the directory itself being replaced.
var (
	fileSettle    = 50 * time.Millisecond
	fileMaxSettle = time.Second
	fileResync    = 30 * time.Second
)

// fileSource reads the YAML files of one directory and watches it.
//
// Any event in the directory triggers a rescan of every file, and a file is
// decoded again only when its content changed. That also covers Kubernetes
// ConfigMap volumes, where the files are symlinks that never change while
// the directory they point into is swapped.
type fileSource struct {
	dir, namespace string
	logger         hclog.Logger

	mu      sync.Mutex
	files   map[string]*fileState // by path
	subdirs []string              // found by the last scan, to watch
	synced  bool
	problem string
}

// fileState is what one file currently contributes.
type fileState struct {
	sum     [sha256.Size]byte // of the content last decoded
	objects []*object         // served: accepted, or kept from the last good version
	notices []sdk.Notice
}

var _ source = (*fileSource)(nil)

func newFileSource(dir, namespace string, logger hclog.Logger) *fileSource {
	return &fileSource{dir: dir, namespace: namespace, logger: logger, files: map[string]*fileState{}}
}

func (s *fileSource) run(ctx context.Context, changed func()) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		s.logger.Error("cannot watch the directory; rescanning periodically", "dir", s.dir, "error", err)
		w = nil
	} else {
		defer w.Close()
	}
	// (Re-)adding the watch is idempotent; it is repeated before every scan
	// because the kernel drops it when the directory itself goes away.
	watchErr := ""
	watch := func() {
		if w == nil {
			return
		}
		msg := ""
		if err := w.Add(s.dir); err != nil {
			msg = err.Error()
		}
		// fsnotify is not recursive: every subdirectory is watched too.
		s.mu.Lock()
		subdirs := s.subdirs
		s.mu.Unlock()
		for _, d := range subdirs {
			_ = w.Add(d) // one gone since the scan is caught by the next
		}
		if msg != watchErr && msg != "" {
			s.logger.Warn("cannot watch the directory; rescanning periodically", "dir", s.dir, "error", msg)
		}
		watchErr = msg
	}
	watch()
	s.scan()
	changed()

	var events chan fsnotify.Event
	var errs chan error
	if w != nil {
		events, errs = w.Events, w.Errors
	}
	settle := time.NewTimer(fileSettle)
	settle.Stop()
	var pendingSince time.Time // zero: no scan pending
	// later schedules a scan once events stop, or fileMaxSettle after the
	// first of them if they do not.
	later := func() {
		now := time.Now()
		if pendingSince.IsZero() {
			pendingSince = now
		}
		if now.Sub(pendingSince) < fileMaxSettle {
			settle.Reset(min(fileSettle, fileMaxSettle-now.Sub(pendingSince)))
		}
	}
	resync := time.NewTicker(fileResync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			settle.Stop()
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			s.logger.Trace("directory event", "event", ev.String())
			later()
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			// An overflow loses events: rescan.
			s.logger.Warn("directory watch", "dir", s.dir, "error", err)
			later()
		case <-settle.C:
			pendingSince = time.Time{}
			watch()
			if s.scan() {
				changed()
			}
			watch() // subdirectories the scan found
		case <-resync.C:
			watch()
			if s.scan() {
				changed()
			}
		}
	}
}

// scan reads the directory and decodes the files whose content changed. It
// reports whether the contents of the source changed.
func (s *fileSource) scan() bool {
	paths, subdirs, err := listConfigFiles(s.dir)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		// Keep serving the last objects read. A directory never read does
		// not count as synced: an empty read would replace what a previous
		// configuration published.
		problem := fmt.Sprintf("directory %s: %v", s.dir, err)
		changed := problem != s.problem
		if changed {
			s.logger.Error("cannot read the directory; keeping its last objects", "dir", s.dir, "error", err)
		}
		s.problem = problem
		return changed
	}
	changed := s.problem != "" || !s.synced
	s.problem, s.synced, s.subdirs = "", true, subdirs

	type job struct {
		path string
		data []byte
		sum  [sha256.Size]byte
		out  *fileState
	}
	var jobs []*job
	present := map[string]bool{}
	for _, path := range paths {
		if fi, err := os.Stat(path); err != nil || fi.IsDir() { // follows symlinks
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				s.logger.Warn("cannot stat file", "file", path, "error", err)
			}
			continue
		}
		present[path] = true
		old := s.files[path]
		data, err := os.ReadFile(path)
		if err != nil {
			st := &fileState{notices: []sdk.Notice{{Subject: path, Message: fmt.Sprintf("cannot read: %v; keeping its last good objects", err)}}}
			if old != nil {
				st.objects = old.objects
			}
			s.files[path] = st
			changed = true
			continue
		}
		sum := sha256.Sum256(data)
		if old != nil && old.sum == sum {
			continue
		}
		jobs = append(jobs, &job{path: path, data: data, sum: sum})
	}
	for _, path := range slices.Sorted(maps.Keys(s.files)) {
		if !present[path] {
			delete(s.files, path)
			changed = true
		}
	}
	if len(jobs) == 0 {
		return changed
	}

	// Decode changed files in parallel: YAML parsing dominates a cold load.
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for _, j := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			j.out = resolveFile(j.path, decodeFile(j.path, j.data, s.namespace), s.files[j.path])
			j.out.sum = j.sum
		})
	}
	wg.Wait()
	for _, j := range jobs {
		s.files[j.path] = j.out
		if n := len(j.out.notices); n > 0 {
			s.logger.Warn("file has rejected objects", "file", j.path, "rejected", n, "first", j.out.notices[0].Message)
		}
	}
	return true
}

// listConfigFiles lists the config files under dir and in its
// subdirectories, as Istio's file config source walks its directory, with
// the subdirectories it went into. Hidden entries are skipped at every
// level (a ConfigMap volume's ..data directory is reached through the
// symlinks beside it), and so are symlinks to directories, which could
// loop. Only an error reading dir itself is returned; a subdirectory that
// cannot be read is skipped and logged by the caller's next scan.
func listConfigFiles(dir string) (files, subdirs []string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), "."):
		case e.IsDir():
			sub, subsub, err := listConfigFiles(path)
			if err != nil {
				continue
			}
			subdirs = append(append(subdirs, path), subsub...)
			files = append(files, sub...)
		case isConfigFile(e.Name()):
			files = append(files, path)
		}
	}
	return files, subdirs, nil
}

// isConfigFile reports whether a directory entry is a file to read: YAML or
// JSON, not hidden (editors' swap files, ConfigMap volume internals).
func isConfigFile(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// resolveFile turns the decoded documents of a file into what it serves.
// A rejected object that was accepted before keeps its last good version.
// If a document cannot even be identified (malformed YAML, no name), every
// object of the last good version that is not defined again is kept too,
// so a file that turns invalid keeps serving until it is fixed.
func resolveFile(path string, docs []decoded, old *fileState) *fileState {
	st := &fileState{}
	defined := map[objectKey]bool{}
	for _, d := range docs {
		if d.obj == nil {
			continue
		}
		if defined[d.key] {
			st.notices = append(st.notices, sdk.Notice{Subject: d.subject(), Message: "defined twice in the file; this definition is ignored"})
			continue
		}
		defined[d.key] = true
		st.objects = append(st.objects, d.obj)
	}
	lastGood := map[objectKey]*object{}
	if old != nil {
		for _, o := range old.objects {
			lastGood[o.key] = o
		}
	}
	var unreadable []decoded
	for _, d := range docs {
		if d.obj != nil {
			continue
		}
		if d.unreadable {
			unreadable = append(unreadable, d)
			continue
		}
		msg := "rejected: " + d.errs.Error()
		if prev, ok := lastGood[d.key]; ok && !defined[d.key] {
			defined[d.key] = true
			st.objects = append(st.objects, prev)
			msg += "; serving its last good version until it is fixed"
		} else {
			msg += "; skipped"
		}
		st.notices = append(st.notices, sdk.Notice{Subject: d.subject(), Message: msg})
	}
	kept := 0
	if len(unreadable) > 0 && old != nil {
		for _, o := range old.objects {
			if !defined[o.key] {
				defined[o.key] = true
				st.objects = append(st.objects, o)
				kept++
			}
		}
	}
	for _, d := range unreadable {
		msg := "rejected: " + d.errs.Error()
		if kept > 0 {
			msg += fmt.Sprintf("; %d more objects of the file's last good version are kept until it is fixed", kept)
		} else {
			msg += "; skipped"
		}
		st.notices = append(st.notices, sdk.Notice{Subject: d.subject(), Message: msg})
	}
	return st
}

func (s *fileSource) contents() contents {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := contents{synced: s.synced, problem: s.problem}
	first := map[objectKey]*object{}
	for _, path := range slices.Sorted(maps.Keys(s.files)) {
		f := s.files[path]
		c.notices = append(c.notices, f.notices...)
		for _, o := range f.objects {
			if prev, dup := first[o.key]; dup {
				c.notices = append(c.notices, sdk.Notice{Subject: o.subject(), Message: "also defined at " + prev.origin + "; this definition is ignored"})
				continue
			}
			first[o.key] = o
			c.objects = append(c.objects, o)
		}
	}
	return c
}
