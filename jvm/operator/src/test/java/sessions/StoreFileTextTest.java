package sessions;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.OutputStream;
import java.io.PrintStream;
import java.io.StringReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

import org.apache.spark.SparkConf;
import org.apache.spark.io.CompressionCodec$;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.rocksdb.EnvOptions;
import org.rocksdb.Options;
import org.rocksdb.RocksDB;
import org.rocksdb.SstFileWriter;

/** The decoder a JVM of its own serves (`main`, through `serve`): files written here by the libraries Spark's state
 * stores use -- Spark's LZ4 codec, RocksDB's SST writer -- come back as their plain bytes; a damaged file, an unknown
 * kind and a malformed request each get a one-line error, and the requests after them are still answered. */
class StoreFileTextTest {

    private static String serve(String requests) throws Exception {
        ByteArrayOutputStream answers = new ByteArrayOutputStream();
        StoreFileText.serve(new BufferedReader(new StringReader(requests)),
                            new PrintStream(answers, true, StandardCharsets.UTF_8));
        return answers.toString(StandardCharsets.UTF_8);
    }

    @Test
    void decodesSparkStreamsAndRocksDbSstsAndAnswersEveryRequest(@TempDir Path dir) throws Exception {
        byte[] plain = "user-42\u0000open rows of user-42".getBytes(StandardCharsets.UTF_8);
        Path stream = dir.resolve("1.delta");
        try (OutputStream out = CompressionCodec$.MODULE$.createCodec(new SparkConf(false), "lz4")
                .compressedOutputStream(Files.newOutputStream(stream))) {
            out.write(plain);
        }
        RocksDB.loadLibrary();
        Path sst = dir.resolve("000001.sst");
        try (Options options = new Options(); EnvOptions env = new EnvOptions();
             SstFileWriter writer = new SstFileWriter(env, options)) {
            writer.open(sst.toString());
            writer.put("k-a".getBytes(StandardCharsets.UTF_8), "v-1".getBytes(StandardCharsets.UTF_8));
            writer.put("k-b".getBytes(StandardCharsets.UTF_8), "v-2".getBytes(StandardCharsets.UTF_8));
            writer.finish();
        }
        Path damaged = dir.resolve("2.delta");
        byte[] foreign = new byte[48];  // LZ4's magic, then a header no LZ4 stream has
        System.arraycopy("LZ4Block".getBytes(StandardCharsets.US_ASCII), 0, foreign, 0, 8);
        Files.write(damaged, foreign);
        String[] answers = serve(String.join("\n",
                "stream\t" + stream + "\t" + dir.resolve("out-1"),
                "stream\t" + damaged + "\t" + dir.resolve("out-2"),
                "zip\t" + stream + "\t" + dir.resolve("out-3"),
                "sst " + sst,
                "sst\t" + sst + "\t" + dir.resolve("out-4"))).split("\n");

        assertEquals(5, answers.length, String.join("|", answers));
        assertEquals("ok " + plain.length, answers[0]);
        assertArrayEquals(plain, Files.readAllBytes(dir.resolve("out-1")));
        assertTrue(answers[1].startsWith("error "), answers[1]);
        assertEquals("error java.lang.IllegalArgumentException: unknown kind: zip", answers[2]);
        assertEquals("error java.lang.IllegalArgumentException: expected: kind, file, output (tab-separated)",
                     answers[3]);
        byte[] expected = "k-a\u0000v-1\u0000k-b\u0000v-2\u0000".getBytes(StandardCharsets.UTF_8);
        assertEquals("ok " + expected.length, answers[4]);
        assertArrayEquals(expected, Files.readAllBytes(dir.resolve("out-4")));
    }
}
