package io.github.rmqtx.interop;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The Java side of cmd/rmqtx-bench's producer workload (-java): a TransactionMQProducer whose
 * local transaction runs over JDBC, written as a Java service without rmqtx writes it, driven
 * round by round by the Go bench so its rounds alternate with the Go sides'.
 *
 * <p>Usage: BenchTx NAMESRV JDBC_URL CONCURRENCY, with the database user and password in the
 * environment (RMQTX_BENCH_JDBC_USER, RMQTX_BENCH_JDBC_PASSWORD: never on the command line).
 * Commands on stdin, one a line, fields separated by tabs; one JSON line on stdout answers each:
 *
 * <ul>
 *   <li>{@code side NAME MODE TOPIC GROUP PAYLOAD INSERT LOG_INSERT CHECK}: start a producer.
 *       MODE {@code biz}: the local transaction is the business INSERT alone; {@code biz+log}: a
 *       row of a hand-written log first (LOG_INSERT), then the business INSERT. The statements
 *       come from the Go bench (the same tables and SQL as its raw sides, JDBC placeholders);
 *       CHECK is the check-back's query (one parameter, the id; it counts rows). Answer
 *       {@code {"side":NAME,"ready":true}}.
 *   <li>{@code round NAME SECONDS MAX_OPS}: a closed loop of CONCURRENCY threads, each sending its
 *       next message as soon as the last returned, for SECONDS (and at most MAX_OPS sends when it
 *       is above 0). Answer: count (sends that came back SEND_OK and COMMIT_MESSAGE), errors,
 *       seconds, p50/p99/p99.9 of sendMessageInTransaction (nearest rank, ms), the check-backs
 *       answered during the round, and the first error.
 * </ul>
 *
 * <p>A failed command answers {@code {"error":...}}. The process stops when stdin is closed.
 *
 * <p>Each side has its own pool: CONCURRENCY + 2 connections opened up front, autocommit off (a
 * transaction begins at its first statement and ends at commit or rollback, the usual pooled-JDBC
 * setting), handed out through a blocking queue. Statements are prepared per use, as the
 * try-with-resources idiom does; the drivers' defaults apply otherwise.
 */
public final class BenchTx {
    /** The property the Go raw sides put the id in (cmd/rmqtx-bench propBenchID). */
    static final String PROP_ID = "BENCH_ID";
    /** The tag every bench message carries (cmd/rmqtx-bench benchEventType). */
    static final String TAG = "BenchEvent";

    private static PrintStream out;

    public static void main(String[] args) throws Exception {
        // The protocol owns stdout: anything a library prints goes to stderr.
        out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        if (args.length != 3) {
            System.err.println("usage: BenchTx NAMESRV JDBC_URL CONCURRENCY");
            System.exit(2);
        }
        String namesrv = args[0], url = args[1];
        int concurrency = Integer.parseInt(args[2]);
        Properties props = new Properties();
        props.setProperty("user", env("RMQTX_BENCH_JDBC_USER"));
        props.setProperty("password", env("RMQTX_BENCH_JDBC_PASSWORD"));

        Map<String, Side> sides = new HashMap<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) {
                    continue;
                }
                String[] f = line.split("\t", -1);
                try {
                    switch (f[0]) {
                        case "side": {
                            if (f.length != 9) {
                                throw new IllegalArgumentException("side wants 8 fields, got " + (f.length - 1));
                            }
                            if (sides.containsKey(f[1])) {
                                throw new IllegalArgumentException("side " + f[1] + " exists");
                            }
                            Side s = new Side(f[1], f[2], f[3], f[4], Integer.parseInt(f[5]), f[6], f[7], f[8],
                                    namesrv, url, props, concurrency);
                            sides.put(f[1], s);
                            print("{\"side\":" + quote(f[1]) + ",\"ready\":true}");
                            break;
                        }
                        case "round": {
                            if (f.length != 4) {
                                throw new IllegalArgumentException("round wants 3 fields, got " + (f.length - 1));
                            }
                            Side s = sides.get(f[1]);
                            if (s == null) {
                                throw new IllegalArgumentException("no side " + f[1]);
                            }
                            print(s.round(concurrency, Double.parseDouble(f[2]), Long.parseLong(f[3])));
                            break;
                        }
                        default:
                            throw new IllegalArgumentException("unknown command " + f[0]);
                    }
                } catch (Exception e) {
                    print("{\"error\":" + quote(e.toString()) + "}");
                }
            }
        } finally {
            for (Side s : sides.values()) {
                s.close();
            }
        }
        System.exit(0); // the client's non-daemon threads must not keep the JVM up
    }

    private static String env(String k) {
        String v = System.getenv(k);
        return v == null ? "" : v;
    }

    private static synchronized void print(String json) {
        out.println(json);
    }

    /** One producer with its listener, its connection pool and its statements. */
    static final class Side implements TransactionListener {
        final String name, topic, insert, logInsert, check;
        final int payload;
        final TransactionMQProducer producer;
        final BlockingQueue<Connection> pool;
        final String url;
        final Properties props;
        final AtomicLong checks = new AtomicLong();
        final AtomicReference<String> localError = new AtomicReference<>();

        Side(String name, String mode, String topic, String group, int payload, String insert, String logInsert,
             String check, String namesrv, String url, Properties props, int concurrency) throws Exception {
            switch (mode) {
                case "biz":
                    logInsert = "";
                    break;
                case "biz+log":
                    if (logInsert.isEmpty()) {
                        throw new IllegalArgumentException("mode biz+log needs the log INSERT");
                    }
                    break;
                default:
                    throw new IllegalArgumentException("mode is biz or biz+log, not " + mode);
            }
            this.name = name;
            this.topic = topic;
            this.payload = payload;
            this.insert = insert;
            this.logInsert = logInsert;
            this.check = check;
            this.url = url;
            this.props = props;
            int size = concurrency + 2; // the senders and the check-backs
            this.pool = new ArrayBlockingQueue<>(size);
            try {
                for (int i = 0; i < size; i++) {
                    pool.add(connect());
                }
            } catch (SQLException e) {
                closePool();
                throw e;
            }
            TransactionMQProducer p = new TransactionMQProducer(group);
            p.setNamesrvAddr(namesrv);
            p.setInstanceName(group + "-" + UUID.randomUUID().toString().substring(0, 6));
            p.setVipChannelEnabled(false); // the broker's main port: the one -net-delay proxies
            p.setRetryTimesWhenSendFailed(2); // as the Go raw sides (producer.WithRetry(2))
            p.setTransactionListener(this);
            try {
                p.start();
            } catch (Exception e) {
                closePool();
                throw e;
            }
            this.producer = p;
        }

        private Connection connect() throws SQLException {
            Connection c = DriverManager.getConnection(url, props);
            c.setAutoCommit(false);
            return c;
        }

        @Override
        public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
            String id = msg.getUserProperty(PROP_ID);
            byte[] body = msg.getBody();
            Connection c;
            try {
                c = pool.take();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return LocalTransactionState.ROLLBACK_MESSAGE;
            }
            try {
                if (!logInsert.isEmpty()) {
                    try (PreparedStatement ps = c.prepareStatement(logInsert)) {
                        ps.setString(1, id);
                        ps.setString(2, msg.getTopic());
                        ps.setBytes(3, body);
                        ps.executeUpdate();
                    }
                }
                try (PreparedStatement ps = c.prepareStatement(insert)) {
                    ps.setString(1, id);
                    ps.setLong(2, body.length);
                    ps.setBytes(3, body);
                    ps.executeUpdate();
                }
                c.commit();
                return LocalTransactionState.COMMIT_MESSAGE;
            } catch (SQLException e) {
                localError.compareAndSet(null, e.toString());
                c = recover(c);
                return LocalTransactionState.ROLLBACK_MESSAGE;
            } finally {
                pool.add(c);
            }
        }

        @Override
        public LocalTransactionState checkLocalTransaction(MessageExt msg) {
            checks.incrementAndGet();
            Connection c;
            try {
                c = pool.take();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return LocalTransactionState.UNKNOW;
            }
            try (PreparedStatement ps = c.prepareStatement(check)) {
                ps.setString(1, msg.getUserProperty(PROP_ID));
                long n = 0;
                try (ResultSet rs = ps.executeQuery()) {
                    if (rs.next()) {
                        n = rs.getLong(1);
                    }
                }
                c.commit(); // end the read's transaction
                return n > 0 ? LocalTransactionState.COMMIT_MESSAGE : LocalTransactionState.UNKNOW;
            } catch (SQLException e) {
                c = recover(c);
                return LocalTransactionState.UNKNOW;
            } finally {
                pool.add(c);
            }
        }

        /** Rolls back after a failure; a connection that is no longer valid is replaced. */
        private Connection recover(Connection c) {
            try {
                c.rollback();
                if (c.isValid(2)) {
                    return c;
                }
            } catch (SQLException ignored) {
                // replaced below
            }
            try {
                c.close();
            } catch (SQLException ignored) {
                // gone already
            }
            try {
                return connect();
            } catch (SQLException e) {
                localError.compareAndSet(null, "reconnect: " + e);
                return c; // the next use fails and tries again
            }
        }

        /** One closed-loop round; returns its JSON line. */
        String round(int concurrency, double seconds, long maxOps) throws InterruptedException {
            AtomicLong seq = new AtomicLong(), count = new AtomicLong(), errors = new AtomicLong();
            AtomicReference<String> firstErr = new AtomicReference<>();
            localError.set(null);
            long checks0 = checks.get();
            long[][] lats = new long[concurrency][];
            int[] nlat = new int[concurrency];
            Thread[] threads = new Thread[concurrency];
            long start = System.nanoTime();
            long deadline = seconds > 0 ? start + (long) (seconds * 1e9) : Long.MAX_VALUE;
            for (int w = 0; w < concurrency; w++) {
                final int worker = w;
                threads[w] = new Thread(() -> {
                    long[] local = new long[1024];
                    int n = 0;
                    while (System.nanoTime() < deadline) {
                        long s = seq.incrementAndGet();
                        if (maxOps > 0 && s > maxOps) {
                            break;
                        }
                        String id = UUID.randomUUID().toString();
                        Message m = new Message(topic, TAG, id, payload(payload, s));
                        m.putUserProperty(PROP_ID, id);
                        long t0 = System.nanoTime();
                        String err;
                        try {
                            TransactionSendResult r = producer.sendMessageInTransaction(m, null);
                            long lat = System.nanoTime() - t0;
                            if (r.getSendStatus() == SendStatus.SEND_OK
                                    && r.getLocalTransactionState() == LocalTransactionState.COMMIT_MESSAGE) {
                                count.incrementAndGet();
                                if (n == local.length) {
                                    local = Arrays.copyOf(local, n * 2);
                                }
                                local[n++] = lat;
                                continue;
                            }
                            err = "send " + r.getSendStatus() + ", local transaction " + r.getLocalTransactionState();
                            String le = localError.get();
                            if (le != null) {
                                err += ": " + le;
                            }
                        } catch (Exception e) {
                            err = e.toString();
                        }
                        errors.incrementAndGet();
                        firstErr.compareAndSet(null, err);
                    }
                    lats[worker] = local;
                    nlat[worker] = n;
                }, "bench-" + name + "-" + w);
                threads[w].start();
            }
            for (Thread t : threads) {
                t.join();
            }
            double elapsed = (System.nanoTime() - start) / 1e9;
            int total = 0;
            for (int n : nlat) {
                total += n;
            }
            long[] all = new long[total];
            int off = 0;
            for (int w = 0; w < concurrency; w++) {
                System.arraycopy(lats[w], 0, all, off, nlat[w]);
                off += nlat[w];
            }
            Arrays.sort(all);
            StringBuilder b = new StringBuilder(256);
            b.append("{\"side\":").append(quote(name))
                    .append(",\"count\":").append(count.get())
                    .append(",\"errors\":").append(errors.get())
                    .append(",\"seconds\":").append(elapsed)
                    .append(",\"p50_ms\":").append(percentileMs(all, 50))
                    .append(",\"p99_ms\":").append(percentileMs(all, 99))
                    .append(",\"p999_ms\":").append(percentileMs(all, 99.9))
                    .append(",\"checks\":").append(checks.get() - checks0);
            if (firstErr.get() != null) {
                b.append(",\"first_error\":").append(quote(firstErr.get()));
            }
            return b.append('}').toString();
        }

        void close() {
            try {
                producer.shutdown();
            } catch (Exception e) {
                System.err.println("BenchTx: shutdown " + name + ": " + e);
            }
            closePool();
        }

        private void closePool() {
            List<Connection> cs = new ArrayList<>();
            pool.drainTo(cs);
            for (Connection c : cs) {
                try {
                    c.close();
                } catch (SQLException ignored) {
                    // closing anyway
                }
            }
        }
    }

    /**
     * The nearest-rank percentile of sorted nanoseconds, in ms (cmd/rmqtx-bench Percentile:
     * rank ceil(p/100 * n)).
     */
    static double percentileMs(long[] sorted, double p) {
        int n = sorted.length;
        if (n == 0) {
            return 0;
        }
        int rank = (int) Math.ceil(p / 100 * n);
        rank = Math.max(1, Math.min(n, rank));
        return sorted[rank - 1] / 1e6;
    }

    /** The Go bench's makePayload: size bytes, a small header that differs per message, then padding. */
    static byte[] payload(int size, long seq) {
        byte[] b = new byte[size];
        byte[] head = ("{\"order\":" + seq + ",\"pad\":\"").getBytes(StandardCharsets.UTF_8);
        int n = Math.min(head.length, size);
        System.arraycopy(head, 0, b, 0, n);
        for (int i = n; i < size; i++) {
            b[i] = (byte) ('a' + i % 26);
        }
        if (size >= 2 && n < size - 2) {
            b[size - 2] = '"';
            b[size - 1] = '}';
        }
        return b;
    }

    /** A JSON string literal. */
    static String quote(String s) {
        StringBuilder b = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char ch = s.charAt(i);
            switch (ch) {
                case '"':
                    b.append("\\\"");
                    break;
                case '\\':
                    b.append("\\\\");
                    break;
                case '\n':
                    b.append("\\n");
                    break;
                case '\r':
                    b.append("\\r");
                    break;
                case '\t':
                    b.append("\\t");
                    break;
                default:
                    if (ch < 0x20) {
                        b.append(String.format("\\u%04x", (int) ch));
                    } else {
                        b.append(ch);
                    }
            }
        }
        return b.append('"').toString();
    }
}
