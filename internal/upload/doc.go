// Package upload pushes rbscope's samples to a Grafana Pyroscope server,
// the continuous-profiling store fleets keep their profiles in.
//
// An Uploader cuts the samples it is given into fixed intervals (10s by
// default, aligned to the wall clock), turns each interval into a gzip'd
// pprof profile (CPU sample types, the sampling period, labels pid,
// thread_name, activity and hostname plus the user's tags) and pushes it to
// Pyroscope's native ingest API:
//
//	POST <url>/ingest?name=<app>{k=v,...}&from=<unix>&until=<unix>
//	     &sampleRate=<hz>&spyName=rbscope&format=pprof
//
// Uploading never disturbs profiling: Add never blocks and never does I/O.
// Profiles wait in a bounded in-memory queue that spills to an on-disk
// queue directory with a byte cap; when both are full the oldest profile is
// dropped, counted and reported. Failed pushes are retried with
// exponential backoff and jitter, and a server that is down produces one
// warning line per outage, not an error. Close flushes what is queued
// within the caller's deadline and leaves what it could not send in the
// queue directory, where the next Uploader with the same directory picks
// it up. Delivery is at least once: a push whose answer is lost (a proxy
// that times out after the server stored it) is sent again, and counted
// once, since Pyroscope keeps one profile per series and timestamp (so
// every profile an Uploader makes gets a timestamp of its own).
//
// Pyroscope answers 422 both to profiles it will never take ("invalid
// argument": outside its ingestion window, 1h back by default) and to
// transient trouble ("empty ring" while it starts): the first are dropped
// and counted as Rejected, the second retried a few times.
//
// Credentials come only from the environment, so they never show in ps:
// PYROSCOPE_BASIC_AUTH_USER and PYROSCOPE_BASIC_AUTH_PASSWORD (basic auth)
// or PYROSCOPE_AUTH_TOKEN (a bearer token); PYROSCOPE_TENANT_ID sets the
// X-Scope-OrgID header of multi-tenant servers.
package upload
