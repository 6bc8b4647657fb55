package testbed

import "go.uber.org/goleak"

// GoleakOptions are the goleak options for test binaries that use the
// testbed: they ignore goroutines that libraries start once per process and
// never stop (klog's flush daemon, client-go's and HTTP/2's process-wide
// helpers). Everything the testbed itself starts is gone after cleanup.
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testbed.GoleakOptions()...) }
func GoleakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	}
}
