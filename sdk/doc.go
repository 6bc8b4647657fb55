// Package sdk is what a registry plugin author imports.
//
// A plugin implements [Plugin] (Describe and Configure) and publishes what it
// knows into the [State] it is handed: services, endpoints and network
// gateways, grouped into instances identified by Provider and Cluster. The
// State turns "this is my current state" into the snapshot-then-deltas stream
// the host expects, so a plugin never deals with sequence numbers, batching or
// reconnects. [Serve] runs the plugin: handshake, protocol negotiation,
// AutoMTLS and logging to the host.
//
// A plugin declares [CapabilityInstanceSet] and calls
// [State.InstanceSetComplete] once every instance it will report is
// declared (a plugin with one instance: right after SetInstance). Until
// then a host that restarted it keeps serving the instances it knew before,
// so a source that is down during a restart costs no endpoints; the
// conformance suite (sdktest) checks that a plugin does this.
//
// A minimal plugin:
//
//	func main() {
//		sdk.Serve(func(rt sdk.Runtime) sdk.Plugin { return &hello{state: rt.State} })
//	}
//
// What registries share lives here too, so every plugin reads a source the
// same way: package istio holds Istio's label keys and its port-name and
// protocol rules; package backoff spaces out retries; [NoticeList] caps
// health notices; a [TypeDuration] attribute decodes into a [Duration];
// [Run] and [Stopper] let Configure and shutdown stop a plugin's watches
// within the host's deadline; [ValueOr] reads unset attributes.
//
// Credentials: mark a credential attribute [Attribute].Sensitive. Its
// value then reaches Configure and nowhere else: the host shows
// "(sensitive)" in /debug/configz, and both the host and the SDK replace
// it with "redacted" in logs (the plugin's Runtime.Logger included) and
// in health messages and notices. Package redact hides the user and
// password of URLs the same way; use redact.URL where a plugin shows a
// URL it was given.
//
// Generated protocol types never appear in this package; see
// proto/registry/v1 for the wire contract.
package sdk
