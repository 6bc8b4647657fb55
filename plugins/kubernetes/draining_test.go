package kubernetes

import (
	"fmt"
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

// conditions writes an endpoint's conditions the way the EndpointSlice
// controller does: all three set.
func conditions(ready, serving, terminating bool) discoveryv1.EndpointConditions {
	return discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(serving), Terminating: ptr.To(terminating)}
}

// healths maps each endpoint address of host to its health.
func healths(in *sdktest.Instance, host string) map[string]sdk.Health {
	out := map[string]sdk.Health{}
	if in == nil {
		return out
	}
	for _, e := range in.Endpoints[host] {
		out[e.Address] = e.Health
	}
	return out
}

// A pod shutting down goes through the states the EndpointSlice controller
// writes: ready; then not ready but serving and terminating (its grace
// period, while it finishes its work): DRAINING; then not serving: gone.
func TestDrainingEndpoints(t *testing.T) {
	tb := testbed.StartKube(t)
	k := kube{t, tb.Client()}
	ns := k.namespace("drain", nil)
	k.service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	})
	k.service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "all", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}, PublishNotReadyAddresses: true},
	})
	slice := func(name, service string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{labelServiceName: service}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.60.0.1"}, Conditions: conditions(true, true, false)},
				{Addresses: []string{"10.60.0.2"}, Conditions: conditions(true, true, false)},
				{Addresses: []string{"10.60.0.3"}, Conditions: conditions(false, false, true)},  // shutting down, failing readiness
				{Addresses: []string{"10.60.0.4"}, Conditions: conditions(false, false, false)}, // starting
			},
		}
	}
	k.slice(slice("echo-1", "echo"))
	k.slice(slice("all-1", "all"))
	echo, all := "echo."+ns+".svc.cluster.local", "all."+ns+".svc.cluster.local"

	rec := startRecorder(t, fmt.Sprintf("kubeconfig = %q\ncluster_id = \"c1\"\n", tb.Kubeconfig), sdk.MeshSettings{})
	want := func(host string, w map[string]sdk.Health) {
		t.Helper()
		rec.waitFor(t, fmt.Sprintf("%s endpoints %v", host, w), func(r *sdktest.Replica) bool {
			got := healths(instance(r, "c1"), host)
			if len(got) != len(w) {
				return false
			}
			for a, h := range w {
				if g, ok := got[a]; !ok || g != h {
					return false
				}
			}
			return true
		})
	}
	want(echo, map[string]sdk.Health{"10.60.0.1": sdk.HealthHealthy, "10.60.0.2": sdk.HealthHealthy})
	want(all, map[string]sdk.Health{"10.60.0.1": sdk.HealthHealthy, "10.60.0.2": sdk.HealthHealthy, "10.60.0.3": sdk.HealthHealthy, "10.60.0.4": sdk.HealthHealthy})

	// 10.60.0.2's pod is deleted: still passing readiness, so serving.
	for _, name := range []string{"echo-1", "all-1"} {
		k.updateSlice(ns, name, func(s *discoveryv1.EndpointSlice) { s.Endpoints[1].Conditions = conditions(false, true, true) })
	}
	want(echo, map[string]sdk.Health{"10.60.0.1": sdk.HealthHealthy, "10.60.0.2": sdk.HealthDraining})
	want(all, map[string]sdk.Health{"10.60.0.1": sdk.HealthHealthy, "10.60.0.2": sdk.HealthDraining, "10.60.0.3": sdk.HealthHealthy, "10.60.0.4": sdk.HealthHealthy})

	// Its readiness probe fails: no longer serving, so it leaves.
	k.updateSlice(ns, "echo-1", func(s *discoveryv1.EndpointSlice) { s.Endpoints[1].Conditions = conditions(false, false, true) })
	want(echo, map[string]sdk.Health{"10.60.0.1": sdk.HealthHealthy})
	rec.with(func(r *sdktest.Replica) {
		if got := endpointAddrs(instance(r, "c1"), echo); !slices.Equal(got, []string{"10.60.0.1"}) {
			t.Errorf("%s endpoints = %v, want only 10.60.0.1", echo, got)
		}
	})
}
