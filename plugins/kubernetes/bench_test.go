package kubernetes

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	kubeclient "k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

const (
	benchNamespaces       = 100
	benchServicesPerNS    = 100 // 10,000 services
	benchEndpointsPerSvc  = 10  // 100,000 endpoints, each a pod
	benchNodes            = 50
	benchCreateGoroutines = 32
)

// BenchmarkColdSync measures a cold start on a real API server holding
// 10,000 services, 10,000 EndpointSlices and 100,000 endpoints backed by
// 100,000 pods on 50 nodes: from the plugin's start until a host's replica
// holds every service and endpoint. The objects are created once with
// client-go (a few minutes, not timed); every iteration starts a fresh
// plugin against them.
//
// Each variant is a sub-benchmark against the same populated API server,
// so a before/after comparison comes from one run:
//   - after: the plugin as it is;
//   - before: as the plugin was: whole Pods decoded and cut down by the
//     transform, responses read unbuffered;
//   - slim-pods: pods decoded straight into podInfo, responses unbuffered,
//     pods streamed with client-go's watch list;
//   - pods-watchlist: as after, but pods streamed with the watch list
//     instead of listed in pages;
//   - after-list: as after, with client-go's WatchListClient off, so every
//     informer lists instead of streaming its initial objects.
//
// COLDSYNC_VARIANTS picks and orders them (comma-separated; a repeated one
// runs again, e.g. "before,after,before,after"); the default is
// "before,after". COLDSYNC_CPUPROFILE_DIR, if set, gets a CPU profile of
// the timed part of each iteration, VARIANT-*.cpu.pprof (`go tool pprof`
// merges the files it is given).
//
// Reported: s/sync, endpoints/s; heap-MB, the live heap the plugin holds
// once synced (live heap with the plugin minus live heap after it stopped,
// with the test's replica kept alive in both); rss-MB, the test process's
// resident memory when synced, after returning freed memory to the OS
// before each start (plugin, replica and Go runtime; the API server and
// etcd are other processes); cpu-s/sync, the test process's CPU time per
// sync, and apiserver-cpu-s/sync, kube-apiserver's and etcd's.
func BenchmarkColdSync(b *testing.B) {
	// client-go logs that its gates were read already (by the testbed);
	// reflectors read them again when they are built, so the swap holds.
	gates := &benchGates{Gates: clientfeatures.FeatureGates(), watchList: clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient)}
	clientfeatures.ReplaceFeatureGates(gates)
	defaultWatchList := gates.watchList
	b.Cleanup(func() { clientfeatures.ReplaceFeatureGates(gates.Gates) })

	tb := testbed.StartKube(b)
	t0 := time.Now()
	populate(b, tb)
	b.Logf("created %d services, %d endpoints and pods in %s", benchNamespaces*benchServicesPerNS,
		benchNamespaces*benchServicesPerNS*benchEndpointsPerSvc, time.Since(t0).Round(time.Second))
	wantServices := benchNamespaces * benchServicesPerNS
	wantEndpoints := wantServices * benchEndpointsPerSvc
	config := fmt.Sprintf("kubeconfig = %q\ncluster_id = \"bench\"\n", tb.Kubeconfig)
	server := serverPIDs(b, tb)

	variants := strings.Split(cmp.Or(os.Getenv("COLDSYNC_VARIANTS"), "before,after"), ",")
	reset := func() {
		fullPodDecode, unbufferedBodies, podWatchList, gates.watchList = false, false, false, defaultWatchList
	}
	defer reset()
	for _, v := range variants {
		reset()
		switch v {
		case "after":
		case "before":
			fullPodDecode, unbufferedBodies = true, true
		case "slim-pods":
			unbufferedBodies, podWatchList = true, true
		case "pods-watchlist":
			podWatchList = true
		case "after-list":
			gates.watchList = false
		default:
			b.Fatalf("COLDSYNC_VARIANTS: unknown variant %q (want after, before, slim-pods, pods-watchlist or after-list)", v)
		}
		b.Run(v, func(b *testing.B) {
			coldSync(b, config, server, wantServices, wantEndpoints, v)
		})
	}
}

// benchGates lets the benchmark turn client-go's WatchListClient on and
// off between variants; reflectors read it when they are built.
type benchGates struct {
	clientfeatures.Gates
	watchList bool
}

func (g *benchGates) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient {
		return g.watchList
	}
	return g.Gates.Enabled(f)
}

func coldSync(b *testing.B, config string, server []int, wantServices, wantEndpoints int, variant string) {
	var total time.Duration
	var heapMB, rssMB, cpu, serverCPU float64
	dir := os.Getenv("COLDSYNC_CPUPROFILE_DIR")
	n := 0
	for b.Loop() {
		b.StopTimer()
		debug.FreeOSMemory()
		var prof *os.File
		if dir != "" {
			var err error
			prof, err = os.CreateTemp(dir, variant+"-*.cpu.pprof")
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.StartCPUProfile(prof); err != nil {
				b.Fatal(err)
			}
		}
		cpu0, server0 := cpuSeconds(os.Getpid()), cpuSeconds(server...)
		b.StartTimer()

		start := time.Now()
		h := sdktest.Start(b, Factory)
		h.Configure(b, config, sdk.MeshSettings{DomainSuffix: "cluster.local"})
		w := h.Watch(b)
		w.WaitFor(b, 5*time.Minute, "every service and endpoint", func(r *sdktest.Replica) bool {
			in := instance(r, "bench")
			if in == nil || !in.Synced || len(in.Services) < wantServices {
				return false
			}
			eps := 0
			for _, e := range in.Endpoints {
				eps += len(e)
			}
			return eps >= wantEndpoints
		})
		total += time.Since(start)
		b.StopTimer()
		cpu += cpuSeconds(os.Getpid()) - cpu0
		serverCPU += cpuSeconds(server...) - server0
		if prof != nil {
			pprof.StopCPUProfile()
			prof.Close()
		}
		rssMB += residentMB()
		withPlugin := liveHeap()
		h.Kill()
		heapMB += float64(withPlugin-heapAfterStop(withPlugin)) / (1 << 20)
		w.Stop()
		n++
		b.StartTimer()
	}
	b.ReportMetric(total.Seconds()/float64(n), "s/sync")
	b.ReportMetric(float64(wantEndpoints)*float64(n)/total.Seconds(), "endpoints/s")
	b.ReportMetric(heapMB/float64(n), "heap-MB")
	b.ReportMetric(rssMB/float64(n), "rss-MB")
	b.ReportMetric(cpu/float64(n), "cpu-s/sync")
	b.ReportMetric(serverCPU/float64(n), "apiserver-cpu-s/sync")
}

// serverPIDs finds the testbed's kube-apiserver (by its port) and etcd
// (by its data directory), whose CPU time the benchmark reports.
func serverPIDs(b *testing.B, tb *testbed.Kube) []int {
	port := tb.Server[strings.LastIndex(tb.Server, ":")+1:]
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		if slices.Contains(args, "--secure-port="+port) || slices.Contains(args, "--data-dir="+filepath.Join(tb.Dir, "etcd")) {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 2 {
		b.Logf("found %d of kube-apiserver and etcd's processes; apiserver-cpu-s/sync counts those", len(pids))
	}
	return pids
}

// cpuSeconds sums the user and system CPU time of processes.
func cpuSeconds(pids ...int) float64 {
	var ticks float64
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis; utime and
		// stime are the 14th and 15th of the line.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseFloat(f[11], 64)
		s, _ := strconv.ParseFloat(f[12], 64)
		ticks += u + s
	}
	return ticks / 100 // USER_HZ
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// heapAfterStop returns the live heap once a stopped plugin's memory is
// collectable: its shutdown runs in its own goroutines, so wait until the
// heap stops shrinking (at most 10 s).
func heapAfterStop(before uint64) uint64 {
	last := before
	for i := 0; i < 50; i++ {
		time.Sleep(200 * time.Millisecond)
		h := liveHeap()
		if h >= last && i > 2 {
			return h
		}
		last = h
	}
	return last
}

// residentMB reads VmRSS of this process.
func residentMB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// populate creates the benchmark's objects with many concurrent clients.
func populate(b *testing.B, tb *testbed.Kube) {
	rc := tb.RestConfig()
	rc.QPS, rc.Burst = 10000, 10000
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	c, err := kubeclient.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	var (
		mu    sync.Mutex
		first error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
		}
	}
	run := func(n int, f func(i int) error) {
		work := make(chan int)
		var wg sync.WaitGroup
		for range benchCreateGoroutines {
			wg.Go(func() {
				for i := range work {
					if err := f(i); err != nil {
						fail(err)
					}
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		if first != nil {
			b.Fatal(first)
		}
	}
	nsName := func(i int) string { return fmt.Sprintf("bench-%03d", i) }
	run(benchNodes, func(i int) error {
		n := nodeObj(fmt.Sprintf("node-%02d", i), map[string]string{corev1.LabelTopologyRegion: "region-" + strconv.Itoa(i%3), corev1.LabelTopologyZone: "zone-" + strconv.Itoa(i%6)})
		_, err := c.CoreV1().Nodes().Create(ctxb, n, metav1.CreateOptions{})
		return err
	})
	run(benchNamespaces, func(i int) error {
		_, err := c.CoreV1().Namespaces().Create(ctxb, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i)}}, metav1.CreateOptions{})
		return err
	})
	services := benchNamespaces * benchServicesPerNS
	run(services, func(i int) error {
		ns, name := nsName(i/benchServicesPerNS), fmt.Sprintf("svc-%03d", i%benchServicesPerNS)
		_, err := c.CoreV1().Services(ns).Create(ctxb, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
				{Name: "http", Port: 80}, {Name: "grpc", Port: 9090},
			}},
		}, metav1.CreateOptions{})
		return err
	})
	run(services*benchEndpointsPerSvc, func(k int) error {
		i := k / benchEndpointsPerSvc
		ns, svc := nsName(i/benchServicesPerNS), fmt.Sprintf("svc-%03d", i%benchServicesPerNS)
		_, err := c.CoreV1().Pods(ns).Create(ctxb, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", svc, k%benchEndpointsPerSvc), Namespace: ns,
				Labels: map[string]string{"app": svc, "version": "v1", istio.LabelTLSMode: "istio"}},
			Spec: corev1.PodSpec{
				NodeName: fmt.Sprintf("node-%02d", k%benchNodes), ServiceAccountName: svc,
				Containers: []corev1.Container{{Name: "app", Image: "example.com/app:1"}},
			},
		}, metav1.CreateOptions{})
		return err
	})
	run(services, func(i int) error {
		ns, svc := nsName(i/benchServicesPerNS), fmt.Sprintf("svc-%03d", i%benchServicesPerNS)
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Namespace: ns, Labels: map[string]string{labelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To("http"), Port: ptr.To[int32](8080)}, {Name: ptr.To("grpc"), Port: ptr.To[int32](9000)},
			},
		}
		for j := range benchEndpointsPerSvc {
			k := i*benchEndpointsPerSvc + j
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 200+k>>16, k>>8&255, k&255)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("%s-%d", svc, j)},
				NodeName:   ptr.To(fmt.Sprintf("node-%02d", k%benchNodes)),
			})
		}
		_, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctxb, s, metav1.CreateOptions{})
		return err
	})
}
