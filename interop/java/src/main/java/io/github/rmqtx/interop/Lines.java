package io.github.rmqtx.interop;

import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;

/** Tab-separated report lines on stdout, read by the Go interop tests. */
final class Lines {
    private static final PrintStream OUT = new PrintStream(System.out, true, StandardCharsets.UTF_8);

    private Lines() {
    }

    static synchronized void print(String... fields) {
        OUT.println(String.join("\t", fields));
    }

    /** Blocks until the test closes stdin: the programs run once per test scenario. */
    static void awaitStdinClosed() {
        try {
            while (System.in.read() != -1) {
                // discard
            }
        } catch (IOException e) {
            // closed
        }
    }
}
