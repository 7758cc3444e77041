package main

// The Java side of the producer workload (-java): a Java service without
// rmqtx, a TransactionMQProducer whose local transaction runs over JDBC
// (interop/java's BenchTx), measured in the same run, against the same
// broker and database, at the same concurrency, its rounds alternating with
// the Go sides'. Issue 35 compares rmqtx Send with it.
//
// One JVM runs both Java sides. The Go bench creates their topics and tables
// and hands BenchTx the statements its raw sides run (JDBC placeholders), so
// the rows are the same shape; each round is a command on BenchTx's stdin,
// answered by one JSON line.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Side names of the Java sides.
const (
	sideJavaTx    = "java tx producer"
	sideJavaTxLog = "java tx producer + log"

	// targetJavaTxLog is issue 35's: rmqtx Send / the Java producer with
	// its hand-written log >= 0.90.
	targetJavaTxLog = 0.90

	// javaMinWarmup is the least warm-up a Java side gets (when -warmup is
	// not 0): the JIT compiles the client's hot paths only after some
	// thousands of sends.
	javaMinWarmup = 5 * time.Second
)

// Environment variables BenchTx reads its database credentials from: never
// on its command line.
const (
	envJavaJDBCUser     = "RMQTX_BENCH_JDBC_USER"
	envJavaJDBCPassword = "RMQTX_BENCH_JDBC_PASSWORD"
)

// errNoJavaBuild is returned when the Java program cannot be built or found.
var errNoJavaBuild = errors.New("rmqtx-bench: -java needs the Java interop build")

// run runs one round (or warm-up) of s: its own Op in a closed loop, at
// most perSecond operations a second when that is above 0 (-rate), or, for
// a side whose round another process runs (round set), that (-rate is
// refused with those sides).
func (s *loopSide) run(ctx context.Context, concurrency int, d time.Duration, n int64, perSecond float64, warmup bool) LoopResult {
	if s.round == nil {
		return RunLoopPaced(ctx, concurrency, d, n, perSecond, s.op)
	}
	res := s.round(ctx, d, n, warmup)
	s.ok.Add(res.Count)
	return res
}

// javaRoundReply is BenchTx's answer to a command.
type javaRoundReply struct {
	Side       string  `json:"side"`
	Ready      bool    `json:"ready"`
	Count      int64   `json:"count"`
	Errors     int64   `json:"errors"`
	Seconds    float64 `json:"seconds"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	P999Ms     float64 `json:"p999_ms"`
	Checks     int64   `json:"checks"`
	FirstError string  `json:"first_error"`
	Error      string  `json:"error"`
}

// parseJavaReply reads one line of BenchTx's stdout.
func parseJavaReply(line []byte) (javaRoundReply, error) {
	var r javaRoundReply
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("rmqtx-bench: java: reply %.200q: %w", line, err)
	}
	if r.Error != "" {
		return r, fmt.Errorf("rmqtx-bench: java: %s", r.Error)
	}
	return r, nil
}

// result converts a round's reply into a LoopResult.
func (r javaRoundReply) result() LoopResult {
	res := LoopResult{
		Count: r.Count, Errors: r.Errors,
		Elapsed:  time.Duration(r.Seconds * float64(time.Second)),
		Measured: &MeasuredLatency{P50Ms: r.P50Ms, P99Ms: r.P99Ms, P999Ms: r.P999Ms},
	}
	if r.FirstError != "" {
		res.FirstErr = fmt.Errorf("java: %s", r.FirstError)
	}
	if r.Count == 0 {
		res.Measured = nil
	}
	return res
}

// repoRoot finds the repository root from the working directory up: the
// folder with scripts/interop-java.sh.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "scripts", "interop-java.sh")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("%w: scripts/interop-java.sh not found above the working directory (run the bench from the repository)", errNoJavaBuild)
		}
		dir = up
	}
}

// javaBuild runs scripts/interop-java.sh (a no-op when the current sources
// are built) and returns the classpath of the build.
func javaBuild(ctx context.Context) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "interop-java.sh"))
	cmd.Dir = root
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%w: scripts/interop-java.sh (needs OpenJDK 17 and Maven): %v\n%s", errNoJavaBuild, err, tail(stderr.String(), 2000))
	}
	dir := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
		return "", fmt.Errorf("%w: no complete build in %q", errNoJavaBuild, dir)
	}
	return filepath.Join(dir, "classes") + string(os.PathListSeparator) + filepath.Join(dir, "lib", "*"), nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// jdbcTarget is the database BenchTx connects to: its JDBC URL (no
// credentials in it) and the user and password for the environment. With
// -net-delay the URL names the database's delay proxy, as for the Go sides.
func (e *Env) jdbcTarget() (url, user, password string, err error) {
	if !e.pg() {
		addr := e.S.MySQLAddr
		if e.S.via != "" {
			addr = e.S.via
		}
		url, err := withJDBCParams("jdbc:mariadb://"+addr+"/"+e.DBName, e.Opt.JavaJDBC)
		return url, e.S.MySQLUser, e.S.MySQLPassword, err
	}
	cfg, err := e.S.pgConfig(e.DBName)
	if err != nil {
		return "", "", "", err
	}
	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if e.S.via != "" {
		addr = e.S.via
	}
	ssl := "disable"
	if cfg.TLSConfig != nil {
		ssl = "require"
	}
	url, err = withJDBCParams("jdbc:postgresql://"+addr+"/"+cfg.Database+"?sslmode="+ssl, e.Opt.JavaJDBC)
	return url, cfg.User, cfg.Password, err
}

// withJDBCParams appends -java-jdbc-params to a JDBC URL. Credentials are
// refused: the URL is logged, they go through the environment.
func withJDBCParams(base, params string) (string, error) {
	if params == "" {
		return base, nil
	}
	q, err := neturl.ParseQuery(params)
	if err != nil {
		return "", fmt.Errorf("rmqtx-bench: -java-jdbc-params: %w", err)
	}
	for k := range q {
		switch strings.ToLower(k) {
		case "user", "password":
			return "", fmt.Errorf("rmqtx-bench: -java-jdbc-params: %s is taken from the services' settings, not the URL", k)
		}
	}
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + params, nil
}

// javaProc is the running BenchTx: one command at a time.
type javaProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan []byte // BenchTx's stdout, closed when it ends
	stderr *tailWriter
	logDir string
	url    string

	mu     sync.Mutex
	closed bool
	refs   atomic.Int32 // sides still using it
}

// tailWriter keeps the last 8 KiB written (BenchTx's stderr, for errors).
type tailWriter struct {
	mu sync.Mutex
	b  []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > 8<<10 {
		w.b = append([]byte(nil), w.b[len(w.b)-8<<10:]...)
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

// startJava builds (if needed) and starts BenchTx with the run's name
// server, database and concurrency. The client's log files go to a
// temporary folder that Close removes.
func startJava(ctx context.Context, e *Env) (*javaProc, error) {
	cp, err := javaBuild(ctx)
	if err != nil {
		return nil, err
	}
	javaBin, err := exec.LookPath("java")
	if err != nil {
		return nil, fmt.Errorf("%w: java not on PATH: %v", errNoJavaBuild, err)
	}
	url, user, password, err := e.jdbcTarget()
	if err != nil {
		return nil, err
	}
	logDir, err := os.MkdirTemp("", "rmqtx-bench-java-")
	if err != nil {
		return nil, fmt.Errorf("rmqtx-bench: java: %w", err)
	}
	args := []string{
		"-Xms128m", "-Xmx512m",
		"-Drocketmq.client.logRoot=" + logDir, "-Drocketmq.client.logLevel=WARN", "-Duser.home=" + logDir,
		"-cp", cp, "io.github.rmqtx.interop.BenchTx",
		e.S.NameServer, url, strconv.Itoa(e.Opt.Concurrency),
	}
	// Not CommandContext: Close ends it (stdin closed, then killed).
	cmd := exec.Command(javaBin, args...)
	cmd.Env = append(os.Environ(), envJavaJDBCUser+"="+user, envJavaJDBCPassword+"="+password)
	j := &javaProc{cmd: cmd, lines: make(chan []byte, 4), stderr: &tailWriter{}, logDir: logDir, url: url}
	cmd.Stderr = j.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		_ = os.RemoveAll(logDir)
		return nil, fmt.Errorf("rmqtx-bench: java: %w", err)
	}
	if j.stdin, err = cmd.StdinPipe(); err != nil {
		_ = os.RemoveAll(logDir)
		return nil, fmt.Errorf("rmqtx-bench: java: %w", err)
	}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(logDir)
		return nil, fmt.Errorf("rmqtx-bench: java: start: %w", err)
	}
	go func() {
		defer close(j.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			j.lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	e.Log("  java: BenchTx pid %d, %s, name server %s", cmd.Process.Pid, url, e.S.NameServer)
	return j, nil
}

// call sends one command and waits for its reply, at most timeout; when ctx
// ends or the reply is late, BenchTx is killed (a round cannot be cut short).
func (j *javaProc) call(ctx context.Context, timeout time.Duration, fields ...string) (javaRoundReply, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return javaRoundReply{}, errors.New("rmqtx-bench: java: BenchTx stopped")
	}
	for _, f := range fields {
		if strings.ContainsAny(f, "\t\n") {
			return javaRoundReply{}, fmt.Errorf("rmqtx-bench: java: field %q has a tab or newline", f)
		}
	}
	if _, err := io.WriteString(j.stdin, strings.Join(fields, "\t")+"\n"); err != nil {
		return javaRoundReply{}, fmt.Errorf("rmqtx-bench: java: write %s: %w\n%s", fields[0], err, tail(j.stderr.String(), 2000))
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-j.lines:
		if !ok {
			return javaRoundReply{}, fmt.Errorf("rmqtx-bench: java: BenchTx exited during %s\n%s", fields[0], tail(j.stderr.String(), 2000))
		}
		return parseJavaReply(line)
	case <-ctx.Done():
		_ = j.cmd.Process.Kill()
		return javaRoundReply{}, ctx.Err()
	case <-t.C:
		_ = j.cmd.Process.Kill()
		return javaRoundReply{}, fmt.Errorf("rmqtx-bench: java: no answer to %s within %s; BenchTx killed\n%s", fields[0], timeout, tail(j.stderr.String(), 2000))
	}
}

// release drops one side's reference; the last one stops BenchTx.
func (j *javaProc) release() {
	if j.refs.Add(-1) <= 0 {
		j.Close()
	}
}

// Close closes BenchTx's stdin (it shuts its producers down and exits),
// kills it if it has not exited within 30 s, and removes its log folder.
func (j *javaProc) Close() {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return
	}
	j.closed = true
	j.mu.Unlock()
	_ = j.stdin.Close()
	done := make(chan struct{})
	go func() {
		for range j.lines { // drain: the reader must reach EOF
		}
		_ = j.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = j.cmd.Process.Kill()
		<-done
	}
	_ = os.RemoveAll(j.logDir)
}

// javaSides starts BenchTx and returns the two Java sides: the business
// INSERT alone, and a hand-written log row first (the raw tx + txlog side's
// table and statement). BenchTx stops when both sides are closed.
func javaSides(ctx context.Context, e *Env) ([]*loopSide, error) {
	j, err := startJava(ctx, e)
	if err != nil {
		return nil, err
	}
	var sides []*loopSide
	for _, withLog := range []bool{false, true} {
		s, err := javaSide(ctx, e, j, withLog)
		if err != nil {
			j.Close()
			return nil, err
		}
		sides = append(sides, s)
	}
	j.refs.Store(int32(len(sides)))
	for _, s := range sides {
		s.close = j.release
	}
	return sides, nil
}

// javaSide creates one Java side's topic and tables and starts its
// producer in BenchTx.
func javaSide(ctx context.Context, e *Env, j *javaProc, withLog bool) (*loopSide, error) {
	kind, name, mode := "pjtx", sideJavaTx, "biz"
	desc := "rocketmq-client (Java) TransactionMQProducer, listener over JDBC: business INSERT; COMMIT (no transaction log)"
	if withLog {
		kind, name, mode = "pjtxl", sideJavaTxLog, "biz+log"
		desc = "rocketmq-client (Java) TransactionMQProducer, listener over JDBC with its own log: log INSERT; business INSERT; COMMIT; the check reads the log"
	}
	topic, group, table := e.Names.Name(kind), e.Names.Name(kind+"g"), e.Names.Name("orders_"+kind)
	if err := e.CreateTopic(ctx, topic, 4); err != nil {
		return nil, err
	}
	if err := e.businessTable(ctx, table); err != nil {
		return nil, err
	}
	// JDBC placeholders are ?, on PostgreSQL too: the statements are not
	// rebound (rawSQL), only the clock differs.
	insert := "INSERT INTO " + table + " (event_id, amount, payload, created_at) VALUES (?, ?, ?, " + e.clock() + ")"
	check := "SELECT COUNT(*) FROM " + table + " WHERE event_id = ?"
	logInsert := ""
	if withLog {
		logTable := e.Names.Name("jhandlog")
		if err := e.handLogTable(ctx, logTable); err != nil {
			return nil, err
		}
		logInsert = "INSERT INTO " + logTable + " (event_id, topic, state, payload, created_at) VALUES (?, ?, 'COMMITTED', ?, " + e.clock() + ")"
		check = "SELECT COUNT(*) FROM " + logTable + " WHERE event_id = ? AND state = 'COMMITTED'"
	}
	if _, err := j.call(ctx, 2*time.Minute, "side", name, mode, topic, group, strconv.Itoa(e.Opt.Payload), insert, logInsert, check); err != nil {
		return nil, fmt.Errorf("java side %s: %w", name, err)
	}
	s := &loopSide{side: &Side{Name: name, Unit: "tx/s", Description: desc}, table: table}
	var checks atomic.Int64
	s.round = func(ctx context.Context, d time.Duration, n int64, warmup bool) LoopResult {
		if warmup && d > 0 && d < javaMinWarmup {
			d = javaMinWarmup
		}
		timeout := d + e.Opt.Timeout
		r, err := j.call(ctx, timeout, "round", name, strconv.FormatFloat(d.Seconds(), 'f', -1, 64), strconv.FormatInt(n, 10))
		if err != nil {
			return LoopResult{FirstErr: err, Errors: 1}
		}
		checks.Add(r.Checks)
		return r.result()
	}
	// Its check-backs per round (in the round's extras, with the Go
	// sides'); the pool is BenchTx's, not the run's *sql.DB.
	s.probe = &roundProbe{checks: checks.Load}
	return s, nil
}

// addJavaRatios adds the Java sides' ratios (issue 35): rmqtx Send against
// the Java producer with its log (target >= 0.90), and each Go raw side
// against its Java twin.
func addJavaRatios(w *Workload) {
	w.AddRatio("rmqtx Send / java tx producer + log", sideRmqtxSend, sideJavaTxLog, targetJavaTxLog)
	w.AddRatio("raw tx producer / java tx producer", sideRawTx, sideJavaTx, 0)
	w.AddRatio("raw tx + txlog / java tx producer + log", sideRawTxLog, sideJavaTxLog, 0)
	w.AddRatio("java tx producer + log / java tx producer", sideJavaTxLog, sideJavaTx, 0)
}

// javaNotes describe the Java sides for the report.
func javaNotes(w *Workload) []string {
	if w.Side(sideJavaTx) == nil {
		return nil
	}
	return []string{"java tx producer (+ log): interop/java BenchTx, one JVM for both sides: rocketmq-client (Java) TransactionMQProducer, sendMessageInTransaction timed end to end; " +
		"the local transaction runs on a fixed pool of concurrency+2 JDBC connections per side (MariaDB Connector/J or the PostgreSQL driver, their defaults plus -java-jdbc-params; autocommit off, so a transaction begins at its first INSERT), " +
		"the same tables and statements as the raw tx sides (log INSERT, business INSERT, COMMIT; the check counts the log row, or the business row without a log); warm-up at least " + javaMinWarmup.String() + " (the JIT)"}
}
