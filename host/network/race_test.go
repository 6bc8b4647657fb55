//go:build race

package network_test

// raceEnabled: sync.Pool drops items on purpose under the race detector.
const raceEnabled = true
