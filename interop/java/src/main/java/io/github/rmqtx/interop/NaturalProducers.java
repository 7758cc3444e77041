package io.github.rmqtx.interop;

import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * Producers written the natural Java way, knowing nothing of rmqtx: a TransactionMQProducer
 * (tag = event type, key = order number, JSON body) and a plain DefaultMQProducer (tag = event
 * type, the request id in a user property, no key).
 *
 * <p>Usage: NaturalProducers NAMESRV TOPIC GROUP RUN ORDERS ROLLBACK_EVERY UNKNOWN_EVERY DUP_EVERY
 * PLAIN. Order i is rolled back when i % ROLLBACK_EVERY == ROLLBACK_EVERY-1; otherwise it commits,
 * directly or (i % UNKNOWN_EVERY == 0) by answering the broker's check after an UNKNOW; a directly
 * committed order with i % DUP_EVERY == 1 is sent a second time (same key, same body), as an
 * application does after a send timeout. One order is sent without a key. Then PLAIN plain
 * messages, the first one twice. Prints TX, PLAIN and CHECK lines, then DONE when every UNKNOW was
 * resolved by a check (or TIMEOUT), and stops when stdin is closed.
 */
public final class NaturalProducers {
    public static void main(String[] args) throws Exception {
        String namesrv = args[0], topic = args[1], group = args[2], run = args[3];
        int orders = Integer.parseInt(args[4]), rollbackEvery = Integer.parseInt(args[5]);
        int unknownEvery = Integer.parseInt(args[6]), dupEvery = Integer.parseInt(args[7]);
        int plain = Integer.parseInt(args[8]);

        Set<String> committedOrders = ConcurrentHashMap.newKeySet(); // "the database"
        Set<String> awaitingCheck = ConcurrentHashMap.newKeySet();
        int unknowns = 0;
        for (int i = 0; i < orders; i++) {
            if (i % rollbackEvery != rollbackEvery - 1 && i % unknownEvery == 0) {
                unknowns++;
            }
        }
        CountDownLatch checked = new CountDownLatch(unknowns);

        TransactionMQProducer tx = new TransactionMQProducer(group);
        tx.setNamesrvAddr(namesrv);
        tx.setInstanceName(group);
        tx.setVipChannelEnabled(false);
        tx.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                String plan = (String) arg;
                switch (plan) {
                    case "rollback":
                        return LocalTransactionState.ROLLBACK_MESSAGE;
                    case "unknown":
                        // The local transaction commits, but its answer is lost.
                        committedOrders.add(msg.getKeys());
                        awaitingCheck.add(msg.getKeys());
                        return LocalTransactionState.UNKNOW;
                    default:
                        committedOrders.add(msg.getKeys() == null ? "" : msg.getKeys());
                        return LocalTransactionState.COMMIT_MESSAGE;
                }
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                String key = msg.getKeys();
                LocalTransactionState answer = key != null && committedOrders.contains(key)
                        ? LocalTransactionState.COMMIT_MESSAGE : LocalTransactionState.ROLLBACK_MESSAGE;
                Lines.print("CHECK", String.valueOf(key), answer.name());
                if (key != null && awaitingCheck.remove(key)) {
                    checked.countDown();
                }
                return answer;
            }
        });
        tx.start();

        for (int i = 0; i < orders; i++) {
            String key = "order-" + run + "-" + i;
            String plan = i % rollbackEvery == rollbackEvery - 1 ? "rollback" : i % unknownEvery == 0 ? "unknown" : "commit";
            byte[] body = RmqtxWire.utf8("{\"orderNo\":\"" + key + "\",\"amount\":" + (100 + i) + "}");
            int copies = plan.equals("commit") && i % dupEvery == 1 ? 2 : 1;
            for (int c = 0; c < copies; c++) {
                Message msg = new Message(topic, "OrderPlaced", key, body);
                TransactionSendResult r = tx.sendMessageInTransaction(msg, plan);
                Lines.print("TX", key, plan, r.getSendStatus().name(), r.getLocalTransactionState().name());
            }
        }
        Message keyless = new Message(topic, "OrderPlaced", RmqtxWire.utf8("{\"orderNo\":null}"));
        TransactionSendResult kr = tx.sendMessageInTransaction(keyless, "commit");
        Lines.print("TX", "-", "commit", kr.getSendStatus().name(), kr.getLocalTransactionState().name());

        DefaultMQProducer p = new DefaultMQProducer(group + "_plain");
        p.setNamesrvAddr(namesrv);
        p.setInstanceName(group + "_plain");
        p.setVipChannelEnabled(false);
        p.start();
        for (int j = 0; j < plain; j++) {
            String requestId = "cancel-" + run + "-" + j;
            byte[] body = RmqtxWire.utf8("{\"cancel\":\"" + requestId + "\"}");
            for (int c = 0; c < (j == 0 ? 2 : 1); c++) {
                Message msg = new Message(topic, "OrderCancelled", body);
                msg.putUserProperty("requestId", requestId);
                SendResult r = p.send(msg);
                Lines.print("PLAIN", requestId, r.getSendStatus().name());
            }
        }

        Lines.print(checked.await(60, TimeUnit.SECONDS) ? "DONE" : "TIMEOUT");
        // Stay up: the broker may check again until its end-transaction is in.
        Lines.awaitStdinClosed();
        p.shutdown();
        tx.shutdown();
    }
}
