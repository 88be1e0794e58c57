"""One SageMaker training job in the SageMaker Python SDK's local mode, run as a user runs it (SDK 2.x:
`sagemaker.estimator.Estimator` with `instance_type="local"`), kept off AWS: dummy credentials and a region in
the boto session, code, channels and output as file:// paths, telemetry off.

The code (source_dir) reaches the containers one of two ways: mounted at /opt/ml/code (local_code, the default),
or, with --s3-endpoint and --bucket, as SageMaker itself ships it: the SDK tars source_dir into sourcedir.tar.gz,
uploads it to that S3 endpoint (a LocalSession with s3_endpoint_url, local_code off) and passes
sagemaker_submit_directory=s3://BUCKET/.../sourcedir.tar.gz, with AWS_ENDPOINT_URL_S3 in the containers' environment;
the image's train fetches it on every host.

Run by tests/test_sagemaker_sdk.py with the interpreter that has the SDK (not this project's: see
scripts/setup.sh). Prints one JSON line: {"raised": null or the exception's text}; the job's artifacts end up in
--output (model.tar.gz, output.tar.gz) as the SDK leaves them.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", required=True)
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--code", required=True, help="folder with the program (SageMaker's source_dir)")
    parser.add_argument("--program", required=True, help="the program's file name in --code (entry_point)")
    parser.add_argument("--ssh", required=True, help="folder with the job's key pair: the `ssh` input channel")
    parser.add_argument("--output", required=True, help="where the SDK puts model.tar.gz and output.tar.gz")
    parser.add_argument("--root", required=True, help="local mode's container_root (its compose project folder)")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the job's environment")
    parser.add_argument("--s3-endpoint", help="an S3 endpoint the code goes through (local_code off); the containers "
                        "must reach it at this address too")  # fmt: skip
    parser.add_argument("--bucket", help="the session's default bucket on --s3-endpoint (it must exist)")
    args = parser.parse_args()

    import boto3
    from sagemaker.estimator import Estimator
    from sagemaker.local import LocalSession

    boto_session = boto3.Session(
        aws_access_key_id="AKIAIMGBUILDTEST0000", aws_secret_access_key="imgbuild-test-not-a-secret",
        region_name="us-east-1",
    )  # fmt: skip
    if bool(args.s3_endpoint) != bool(args.bucket):
        parser.error("--s3-endpoint and --bucket go together")
    through_s3 = {"s3_endpoint_url": args.s3_endpoint, "default_bucket": args.bucket} if args.s3_endpoint else {}
    session = LocalSession(
        boto_session=boto_session,
        sagemaker_config={"SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}},
        **through_s3,
    )
    session.config = {"local": {"local_code": not through_s3, "container_root": args.root}}
    estimator = Estimator(
        image_uri=args.image,
        role="arn:aws:iam::111111111111:role/imgbuild-test",
        instance_count=args.hosts,
        instance_type="local",
        sagemaker_session=session,
        entry_point=args.program,
        source_dir=args.code,
        output_path=f"file://{args.output}",
        environment=dict(e.split("=", 1) for e in args.env),
        disable_profiler=True,
    )
    raised = None
    try:
        estimator.fit({"ssh": f"file://{args.ssh}"}, wait=True, logs=True)
    except Exception as exc:  # the job's failure, reported to the test as data
        traceback.print_exc()
        raised = f"{type(exc).__name__}: {exc}"
    sys.stdout.flush()
    print(json.dumps({"raised": raised}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
