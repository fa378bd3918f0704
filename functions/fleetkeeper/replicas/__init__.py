"""What a replica is given: its identity (an IAM role per owner), its secrets (SSM SecureStrings)
and its workdir (S3, or a local directory in embedded mode).
"""
