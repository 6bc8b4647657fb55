package kubernetes

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

// TestDualStack runs on an API server with an IPv4 and an IPv6 Service
// range. A dual-stack Service gets a ClusterIP of each family, both VIPs.
// A pod in both of its EndpointSlices (one per address family, as the
// EndpointSlice controller writes them) is one endpoint with the other
// family as an additional address, not two endpoints.
func TestDualStack(t *testing.T) {
	tb := testbed.StartKube(t, testbed.WithDualStack())
	k := kube{t, tb.Client()}
	ns := k.namespace("dual", nil)
	k.pod(ns, "p1", map[string]string{"app": "echo"}, "", "")
	k.pod(ns, "p2", map[string]string{"app": "echo"}, "", "")
	svc := func(name string, families ...corev1.IPFamily) *corev1.Service {
		return k.service(&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{
				Ports:          []corev1.ServicePort{{Name: "http", Port: 80}},
				IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
				IPFamilies:     families,
			},
		})
	}
	v4first := svc("echo", corev1.IPv4Protocol, corev1.IPv6Protocol)
	v6first := svc("echo6", corev1.IPv6Protocol, corev1.IPv4Protocol)
	if len(v4first.Spec.ClusterIPs) != 2 || len(v6first.Spec.ClusterIPs) != 2 {
		t.Fatalf("the API server gave ClusterIPs %v and %v, want one of each family", v4first.Spec.ClusterIPs, v6first.Spec.ClusterIPs)
	}
	slice := func(name, service string, family discoveryv1.AddressType, eps map[string]string) {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{labelServiceName: service}},
			AddressType: family,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		}
		for _, pod := range slices.Sorted(maps.Keys(eps)) {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{eps[pod]},
				Conditions: conditions(true, true, false),
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod},
			})
		}
		k.slice(s)
	}
	for _, name := range []string{"echo", "echo6"} {
		slice(name+"-v4", name, discoveryv1.AddressTypeIPv4, map[string]string{"p1": "10.70.0.1", "p2": "10.70.0.2"})
		slice(name+"-v6", name, discoveryv1.AddressTypeIPv6, map[string]string{"p1": "fd00:10:244::1"})
	}

	rec := startRecorder(t, fmt.Sprintf("kubeconfig = %q\ncluster_id = \"c1\"\n", tb.Kubeconfig), sdk.MeshSettings{})
	type addrs struct {
		addr  string
		extra []string
	}
	check := func(host string, vips []string, want []addrs) {
		t.Helper()
		rec.waitFor(t, host+" endpoints", func(r *sdktest.Replica) bool {
			in := instance(r, "c1")
			return in != nil && in.Synced && len(in.Endpoints[host]) > 0
		})
		rec.with(func(r *sdktest.Replica) {
			in := instance(r, "c1")
			if got := in.Services[host].VIPs["c1"]; !slices.Equal(got, vips) {
				t.Errorf("%s VIPs = %v, want both ClusterIPs %v", host, got, vips)
			}
			var got []addrs
			for _, e := range in.Endpoints[host] {
				got = append(got, addrs{e.Address, e.AdditionalAddresses})
			}
			if !slices.EqualFunc(got, want, func(a, b addrs) bool { return a.addr == b.addr && slices.Equal(a.extra, b.extra) }) {
				t.Errorf("%s endpoints = %v, want %v", host, got, want)
			}
		})
	}
	// The primary address is of the service's first family.
	check("echo."+ns+".svc.cluster.local", v4first.Spec.ClusterIPs, []addrs{{"10.70.0.1", []string{"fd00:10:244::1"}}, {"10.70.0.2", nil}})
	check("echo6."+ns+".svc.cluster.local", v6first.Spec.ClusterIPs, []addrs{{"10.70.0.2", nil}, {"fd00:10:244::1", []string{"10.70.0.1"}}})

	// p1 leaves the IPv6 slice: one address left, still one endpoint.
	k.updateSlice(ns, "echo-v6", func(s *discoveryv1.EndpointSlice) { s.Endpoints = nil })
	host := "echo." + ns + ".svc.cluster.local"
	rec.waitFor(t, "p1 without its IPv6 address", func(r *sdktest.Replica) bool {
		eps := instance(r, "c1").Endpoints[host]
		return len(eps) == 2 && eps[0].Address == "10.70.0.1" && len(eps[0].AdditionalAddresses) == 0
	})
}
