package io.github.rmqtx.interop;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Arrays;
import java.util.HexFormat;

import org.apache.rocketmq.common.message.Message;

/**
 * The rmqtx wire format (WIRE.md, Go package wire) for Java producers and consumers:
 * property names and a builder for a message that an rmqtx consumer applies exactly once.
 */
public final class RmqtxWire {
    public static final String FORMAT_VERSION = "RMQTX_FORMAT_VERSION";
    public static final String EVENT_ID = "RMQTX_EVENT_ID";
    public static final String EVENT_TYPE = "RMQTX_EVENT_TYPE";
    public static final String EVENT_VERSION = "RMQTX_EVENT_VERSION";
    public static final String AGG_TYPE = "RMQTX_AGG_TYPE";
    public static final String AGG_ID = "RMQTX_AGG_ID";
    public static final String AGG_VERSION = "RMQTX_AGG_VERSION";
    public static final String BIZ_KEY = "RMQTX_BIZ_KEY";
    public static final String PAYLOAD_SHA256 = "RMQTX_PAYLOAD_SHA256";
    public static final String HEADER_PREFIX = "rmqtx.h.";

    private RmqtxWire() {
    }

    /** Hex SHA-256 of the body; rmqtx writes lower case and reads either case. */
    public static String sha256Hex(byte[] body, boolean upperCase) {
        try {
            byte[] sum = MessageDigest.getInstance("SHA-256").digest(body);
            HexFormat hex = upperCase ? HexFormat.of().withUpperCase() : HexFormat.of();
            return hex.formatHex(sum);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    /**
     * An rmqtx event: the event type is the tag, the business key and the event id are the keys
     * (the id last), and the envelope travels as user properties.
     */
    public static Message event(String topic, String eventId, String eventType, String businessKey, byte[] body) {
        Message msg = new Message(topic, eventType, body);
        msg.setKeys(Arrays.asList(businessKey, eventId));
        msg.putUserProperty(FORMAT_VERSION, "1");
        msg.putUserProperty(EVENT_ID, eventId);
        msg.putUserProperty(EVENT_TYPE, eventType);
        msg.putUserProperty(EVENT_VERSION, "0");
        msg.putUserProperty(BIZ_KEY, businessKey);
        msg.putUserProperty(PAYLOAD_SHA256, sha256Hex(body, false));
        return msg;
    }

    /** Marks the event as version {@code version} of an aggregate (arms the consumer's version guard). */
    public static Message withAggregate(Message msg, String aggType, String aggId, long version) {
        msg.putUserProperty(AGG_TYPE, aggType);
        msg.putUserProperty(AGG_ID, aggId);
        msg.putUserProperty(AGG_VERSION, Long.toString(version));
        return msg;
    }

    static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }
}
